"""`python -m ftcluster.client identity|bench|text ...`: the same commands as `ftcluster client`.

The launcher runs this on rank 0's node, where the `ftcluster` script may not be on PATH.
"""

import sys

from ftcluster.cli import entry

entry(["client", *sys.argv[1:]])
