"""cli"""

from hyperpod_lab.cli.commands import build_parser, main, run, spec_from_args

__all__ = ["build_parser", "main", "run", "spec_from_args"]
