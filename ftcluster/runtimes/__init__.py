"""Container runtimes on the launcher side, one module each (none, Pyxis, Charliecloud, Docker):
what is checked of the image before a submission and what a run needs beside its files. Which
runtime a run uses is ftcluster.spec.launch_styles' table; a scheduler holds it
(ftcluster.schedulers)."""
