"""Where commands run: on this machine, on a login node over SSH, on many nodes at once."""
