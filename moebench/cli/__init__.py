"""The command line: `moebench sweep | run | list | report | compare | ab | trace | tune | env`
(main.py parses and dispatches; report.py holds report and compare, ab.py ab)."""
from moebench.cli.main import main

__all__ = ["main"]
