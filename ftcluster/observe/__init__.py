"""What a run says: its status, its report, its samples, the documented JSON objects."""
