"""Helpers the benchmarks share with the tests' process helpers (``tests/agents.py``).

Benchmarks never import ``tests/``; what both need lives here, and the tests import it from
here (the repository root is on ``sys.path`` in both: the benchmarks insert it, and
``tests/conftest.py`` does for pytest).
"""

from __future__ import annotations

import signal
import subprocess


def stop_procs(procs: list[subprocess.Popen], timeout_s: float = 20.0) -> None:
    """Stop processes we started: SIGTERM to each one still running (a launch agent then stops
    its workers), wait up to ``timeout_s`` seconds for each, SIGKILL and reap any still alive."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
