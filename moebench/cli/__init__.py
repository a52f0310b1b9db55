"""The command line: `moebench sweep | run | list | report | compare | ab | trace | tune | env`
(main.py dispatches; each command's module declares its arguments beside its body, parser.py
assembles them: report.py holds report and compare, sweep.py sweep and run, ab.py ab)."""

from moebench.cli.main import main

__all__ = ["main"]
