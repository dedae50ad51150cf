"""`python3 scripts/ftcluster_job scripts/job.json` (a run folder's copy) or `python -m ftcluster.job`;
`... front scripts/front.json`: a replica set's balancer (ftcluster_job.front); `... gpus ...`: a
node's GPU sampler beside its rank (ftcluster_job.gpu_sampler)."""

import importlib
import os
import sys

_args = sys.argv[1:]
_module = "supervisor"
_commands = {"front": "front", "gpus": "gpu_sampler"}
if _args[:1] and _args[0] in _commands:
    _module, _args = _commands[_args[0]], _args[1:]
if __package__:
    main = importlib.import_module(f"{__package__}.{_module}").main
else:
    # Run as a folder: Python put the folder itself first on sys.path; its parent holds the package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(_here)
    main = importlib.import_module(f"{os.path.basename(_here)}.{_module}").main

sys.exit(main(_args))
