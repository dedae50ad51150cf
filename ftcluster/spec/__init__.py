"""What the user wrote: the cluster and model specs, validated with every problem at once,
the names an env may use, the YAML reader, the launch styles' table and FT's config formats."""
