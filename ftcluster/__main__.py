from ftcluster.cli import entry

entry()
