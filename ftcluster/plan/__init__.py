"""Pure planning: the parallel plan (tensor x pipeline over nodes x GPUs), replicas, the
endpoint's ports and access, what the checkpoint must hold and where ranks see it."""
