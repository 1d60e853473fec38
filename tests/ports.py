"""Test helper: free loopback ports, the one ``free_port`` (in ``benchmarks/_common.py``, which
benchmarks and tests share; benchmarks never import tests/). Torch-free, so any helper may
import it, also inside a jupyter-server subprocess that has only tests/ on its path."""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from benchmarks._common import free_port  # noqa: E402,F401
