"""`python3 scripts/ftcluster_job scripts/job.json` (a run folder's copy) or `python -m ftcluster.job`."""

import importlib
import os
import sys

if __package__:
    from .supervisor import main
else:
    # Run as a folder: Python put the folder itself first on sys.path; its parent holds the package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(_here)
    main = importlib.import_module(os.path.basename(_here) + ".supervisor").main

sys.exit(main(sys.argv[1:]))
