"""``python -m hyperpod_lab.envexec -- ARGV...``: run ARGV with extra environment variables read
from standard input, so that secret values never appear in a command line, a file or a log.

Standard input holds one JSON object ``{"NAME": "value", ...}`` (at most :data:`MAX_BYTES`).
The Slurm backend runs ``sbatch`` this way on the login node: sbatch's default
``--export=ALL`` hands the variables to the job (Slurm keeps a job's environment in the
controller's state directory, not on shared storage), and a requeued run gets them again.
Exit status: ARGV's, or 2 for bad input (the reason on stderr, never the values).
"""

from __future__ import annotations

import json
import os
import re
import sys

MAX_BYTES = 64 * 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse(data: bytes) -> dict[str, str]:
    """The variables of ``data``. Raises ValueError naming the problem (never a value)."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes of variables on standard input")
    try:
        env = json.loads(data or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("standard input is not a JSON object of variables") from None
    if not isinstance(env, dict):
        raise ValueError("standard input is not a JSON object of variables")
    for k, v in env.items():
        if not _NAME.fullmatch(k) or not isinstance(v, str) or "\0" in v:
            raise ValueError(f"variable {k[:100]!r}: names must match {_NAME.pattern} and values be strings without NUL")
    return env


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m hyperpod_lab.envexec -- ARGV...  (variables as JSON on stdin)", file=sys.stderr)
        return 2
    try:
        env = parse(sys.stdin.buffer.read(MAX_BYTES + 1))
    except ValueError as e:
        print(f"envexec: {e}", file=sys.stderr)
        return 2
    os.execvpe(argv[1], argv[1:], {**os.environ, **env})
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
