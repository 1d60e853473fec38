"""``%hyperpod`` and ``%%hyperpod``: the CLI's surface inside IPython.

* ``%hyperpod <subcommand> ...`` runs ``hyperpod-lab <subcommand> ...``; ``job = %hyperpod submit ...``
  captures the job as a :class:`hyperpod_lab.notebook.handle.Job` (a ``str`` of the id with ``.monitor()``,
  ``.status()``, ``.wait()``, ``.events()``).
* ``%hyperpod watch JOB``: a live monitor widget (state, steps, loss, events, faults/recoveries).
* ``%hyperpod inject-fault JOB --rank R [--kind kill|node|exception|hang|slow] [--factor F]``:
  rehearse a failure of one rank (SIGKILL, its node failed as the scheduler sees it, an exception
  in its training step, a hang: its process stopped with SIGSTOP until the watchdog recovers it,
  or a slowdown: its steps take F times longer, default 2); see ``hyperpod-lab inject-fault --help``.
* ``%%hyperpod submit [options] [-- ARGS]``: the cell body is the training script. The options are
  ``hyperpod-lab submit``'s, e.g. ``--tracking mlflow [--tracking-uri URI]`` (the job's MLflow run;
  the URI defaults to the kernel's ``$MLFLOW_TRACKING_URI``, docs/tracking.md).
* ``%%hyperpod run --local --nproc 2 [-- ARGS]``: run the cell body here with torchrun (the
  ``local`` cluster) and stream its events until it finishes; other options go to ``submit``
  (``--tracking mlflow``...).

Errors print ``error: ...`` (problem and fix) instead of a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import sys

from hyperpod_lab.cli import run
from hyperpod_lab.errors import HyperPodLabError, SpecError
from hyperpod_lab.notebook.handle import Job


def _cell_script(body: str) -> str:
    """Write a cell body to ``.hyperpod/cells/cell-<hash>.py`` under the cwd; return its path."""
    d = os.path.join(os.getcwd(), ".hyperpod", "cells")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"cell-{hashlib.sha256(body.encode()).hexdigest()[:12]}.py")
    with open(path, "w") as f:
        f.write(body)
    return path


def _run_cell(line: str, cell: str):
    argv = shlex.split(line)
    if not argv or argv[0] not in ("submit", "run"):
        raise SpecError("%%hyperpod", "use '%%hyperpod submit [options]' or '%%hyperpod run --local --nproc N'")
    script = _cell_script(cell)
    if argv[0] == "submit":
        return run(["submit", script, *argv[1:]])
    rest, extra = argv[1:], []
    if "--" in rest:
        i = rest.index("--")
        rest, extra = rest[:i], rest[i:]
    p = argparse.ArgumentParser(prog="%%hyperpod run", add_help=False)
    p.add_argument("--local", action="store_true")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--name", default="cell")
    known, unknown = p.parse_known_args(rest)
    if not known.local:
        raise SpecError("%%hyperpod run", "add --local (run here with torchrun), or use '%%hyperpod submit --cluster NAME'")
    return run(["submit", script, "--cluster", "local", "--nodes", "1", "--procs-per-node", str(known.nproc),
                "--name", known.name, "--follow", *unknown, *extra])


def _watch(argv: list[str]):
    """``%hyperpod watch JOB``: a live :class:`hyperpod_lab.notebook.widgets.JobMonitor` as the cell's output."""
    if len(argv) != 1:
        raise SpecError("%hyperpod watch", "give one job id: %hyperpod watch JOB (list them with %hyperpod jobs)")
    return Job(argv[0]).monitor()


def register(ipython) -> None:
    """Register the magics on an IPython shell (``%load_ext hyperpod_lab`` calls this)."""
    def hyperpod(line, cell=None):
        try:
            if cell is None:
                argv = shlex.split(line)
                if argv[:1] == ["watch"]:
                    return _watch(argv[1:])
                res = run(argv)
                return Job(res) if argv[:1] == ["submit"] and isinstance(res, str) else res
            res = _run_cell(line, cell)
            return Job(res) if isinstance(res, str) else res
        except (HyperPodLabError, TimeoutError) as e:
            print(f"error: {e}", file=sys.stderr)
            return None

    hyperpod.__doc__ = __doc__
    ipython.register_magic_function(hyperpod, magic_kind="line_cell", magic_name="hyperpod")
