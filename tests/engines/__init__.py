"""Engines that exist only for the tests: each plugs in through ftcluster.engines.base.Engine
and the `ftcluster.engines` entry-point group, as another package's engine would."""
