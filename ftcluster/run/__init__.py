"""A run's folder and record: the run store, the folder's layout, its events and logs, and
the one reading of a run's state."""
