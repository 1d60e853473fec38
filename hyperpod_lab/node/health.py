"""Pre-flight node health checks: is this node fit to train before step 0?

The supervisor (:mod:`hyperpod_lab.node.supervisor`) runs, with ``srun`` on every node of a
Slurm allocation, before it starts training::

    python -m hyperpod_lab.node.health --node-run-id RUN [--expect-gpus N] [--shm-bytes B]
        [--expect-version V] [--expect-torch V]

with the job's variables set (``$HYPERPOD_LAB_JOB_DIR``, ``$HYPERPOD_LAB_JOB_ID``,
``$HYPERPOD_LAB_SPEC``; names in :mod:`hyperpod_lab.jobdir`). Each check ends ``passed``,
``failed`` (with a detail that names the problem and the fix) or ``skipped`` (with the reason: a
check that cannot run is skipped, never reported passed), and records its own duration in seconds.

``gpu``
    When GPUs are expected (``--expect-gpus N``, N > 0): ``nvidia-smi
    --query-gpu=index,name,uuid,pci.bus_id,memory.total,ecc.errors.uncorrected.volatile.total,
    retired_pages.pending,remapped_rows.pending,remapped_rows.failure --format=csv,noheader,nounits``
    must list >= N GPUs, none with an uncorrected ECC error since the driver loaded, a retired page
    or remapped row pending (a GPU reset is due) or a row-remapping failure; and
    ``torch.cuda.device_count()`` must be >= N when torch imports. No ``nvidia-smi`` (or one that
    fails, or hangs 30 s) with GPUs expected fails. N = 0: skipped ("no GPU requested"). Extra:
    ``expected``, ``visible``, ``gpus`` (one dict per GPU), ``torch_devices``.
``shm``
    Free bytes (``statvfs``: ``f_bavail * f_frsize``) of the file system holding the memory tier's
    directory for this node, ``<shm_root>/<job_id>/<node>`` (its nearest existing ancestor; nothing
    is created), plus the bytes the job already holds there (its slots are reused), must be >= the
    budget. ``shm_root``: ``$HYPERPOD_LAB_SHM_DIR``, else ``/dev/shm/hyperpod-lab``
    (:func:`hyperpod_lab.jobdir.shm_root`). Budget (bytes): ``--shm-bytes``; else the most
    this job's ranks ever held on one node (the max over its ``checkpoint.saved`` events of tier
    ``memory``, per node and step, of the sum of the ranks' ``memory_bytes``), at least
    ``$HYPERPOD_LAB_HEALTH_MIN_SHM_BYTES`` (default 64 MiB). Skipped when the job has no memory
    tier (``checkpoint.memory_every_steps`` unset and recovery not ``checkpointless``). Extra:
    ``path``, ``free_bytes``, ``held_bytes``, ``needed_bytes``, ``budget_from``. First, skipped or
    not, it deletes the memory tier of this user's jobs that are over (a cancelled, failed or timed
    out job's ranks were killed before they could): :mod:`hyperpod_lab.node.shm_reclaim`; what it
    freed is in the detail and in ``reclaimed`` [{``job_id``, ``bytes``, ``why``}].
``storage``
    Writes 1 MiB to a new probe file in ``<job_dir>/health/<node>/`` (created), fsyncs it, reads it
    back, compares, deletes it. An ``OSError`` (``EROFS``, ``EACCES``, ``ENOSPC``, ...) fails naming
    the errno and the path. Extra: ``path``, ``write_s`` (write + fsync, seconds), ``read_s``,
    ``bytes``.
``versions``
    ``hyperpod_lab.__version__`` must equal ``--expect-version`` and ``torch.__version__``
    ``--expect-torch`` (each part left out when not given; skipped when neither is); torch must
    import. Extra: ``versions`` {``hyperpod_lab``, ``torch``, ``torch_cuda``, ``python``}, always.
``clock``
    Skew (seconds) = this node's ``time.time()`` right after the probe's fsync minus the probe's
    mtime as the shared storage reports it (NFS, FSx for OpenZFS/ONTAP: the server's clock; a local
    disk or Lustre, whose clients stamp mtime: ~0, so the check cannot see a wrong clock there).
    Fails when ``|skew| > $HYPERPOD_LAB_HEALTH_MAX_CLOCK_SKEW_S`` (default 2.0 s). Skipped when the
    storage check failed. Extra: ``skew_s``, ``max_skew_s``.

What the CLI writes: one ``health.checked`` event {node, run_id, ok, checks: {name: {status,
detail, seconds, ...extra}}, seconds} (writer ``health-<node>``) and one ``health.failed`` {node,
run_id, check, detail} per failed check; the :class:`NodeHealth` as JSON to
``<job_dir>/health/<run_id>/<node>.json`` (atomically); one line per check on stdout, prefixed
``hyperpod-lab: health <node>:``. Exit status: 0 no check failed; 1 a check failed, or the
result could not be recorded (event or result file); 2 a usage error (bad arguments, no
``$HYPERPOD_LAB_JOB_DIR``).

What the supervisor does with the results: it reads every node's file (:func:`load_results`),
adds the cross-node check (:func:`summarize`: a node whose torch or hyperpod-lab version differs
from the majority's fails ``versions``) and, for each failed node, excludes it (``node.excluded``),
replaces it with a spare (``resiliency.spares``), or fails the job before step 0 when no spare is
left. A node that wrote no result must be treated as failed (it may not have run at all). ``resiliency.health_checks: false``
(``--no-health-checks``) skips all of this.

This module needs no GPU, and imports torch only inside the ``gpu`` (when GPUs are expected) and
``versions`` checks. (``python -m hyperpod_lab.node.health`` imports the package
``hyperpod_lab.runtime`` first, which today imports torch itself.)
"""

from __future__ import annotations

import argparse
import collections
import copy
import csv
import errno as errno_mod
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from hyperpod_lab.events import RANK_WRITER_PREFIX, EventKind, EventWriter, health_writer, tail_events
from hyperpod_lab.jobdir import (
    ENV_HEALTH_MAX_CLOCK_SKEW_S,
    ENV_HEALTH_MIN_SHM_BYTES,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_SHM_DIR,
    ENV_SPEC,
    RECOVERY_CHECKPOINTLESS,
    TIER_MEMORY,
    JobPaths,
)
from hyperpod_lab.node.shm_reclaim import Reclaimed, held_bytes, reclaim_ended_jobs

__all__ = ["CheckResult", "NodeHealth", "check_node", "summarize", "load_results", "results_dir", "result_path",
           "measured_shm_bytes",
           "main", "PASSED", "FAILED", "SKIPPED", "CHECKS", "ENV_HEALTH_MIN_SHM_BYTES", "ENV_HEALTH_MAX_CLOCK_SKEW_S",
           "DEFAULT_MIN_SHM_BYTES", "DEFAULT_MAX_CLOCK_SKEW_S"]

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
CHECKS = ("gpu", "shm", "storage", "versions", "clock")
"""The checks, in the order they run."""

DEFAULT_MIN_SHM_BYTES = 64 * 2**20
DEFAULT_MAX_CLOCK_SKEW_S = 2.0
PROBE_BYTES = 2**20
NVIDIA_SMI_TIMEOUT_S = 30.0
GPU_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "ecc.errors.uncorrected.volatile.total",
              "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure")
"""``nvidia-smi --query-gpu`` fields asked for; a driver that lacks one (older than row remapping)
is asked again for :data:`GPU_BASIC_FIELDS`."""
GPU_BASIC_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass
class CheckResult:
    """One check's outcome.

    Attributes:
        name: one of :data:`CHECKS`.
        status: ``passed``, ``failed`` or ``skipped``.
        detail: one human line: what was found; on failure the problem and the fix; when skipped why.
        seconds: how long the check ran (wall clock, seconds).
        extra: check-specific measurements (``free_bytes``, ``needed_bytes``, ``write_s``,
            ``skew_s``, ``versions``, ``gpus``, ...), JSON values.
    """

    name: str
    status: str
    detail: str
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{status, detail, seconds, **extra}`` (the shape of one entry of an event's ``checks``; a copy)."""
        return {**copy.deepcopy(self.extra), "status": self.status, "detail": self.detail,
                "seconds": round(self.seconds, 6)}

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> "CheckResult":
        """Inverse of :meth:`to_dict`. Raises ValueError for a status outside the three, KeyError for a missing one."""
        d = dict(d)
        status, detail, seconds = d.pop("status"), d.pop("detail", ""), d.pop("seconds", 0.0)
        if status not in (PASSED, FAILED, SKIPPED):
            raise ValueError(f"check {name!r} has status {status!r}, not passed/failed/skipped")
        return cls(str(name), status, str(detail), float(seconds), d)


@dataclass
class NodeHealth:
    """The health of one node: every check's result.

    Attributes:
        node: the node's name (:func:`hyperpod_lab.jobdir.node_name`).
        job_id: the job.
        checks: check name -> :class:`CheckResult`, in the order they ran.
        seconds: all checks together, seconds.
        time: when the checks ended, seconds since the epoch.
        run_id: the supervisor's ``--node-run-id`` (None when called as a function).
    """

    node: str
    job_id: str
    checks: dict[str, CheckResult]
    seconds: float
    time: float
    run_id: str | None = None

    @property
    def ok(self) -> bool:
        """No check failed (skipped checks do not count either way)."""
        return not self.failed

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks.values() if c.status == FAILED]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {node, job_id, run_id, ok, seconds, time, checks: {name: {status, detail, seconds, ...}}}."""
        return {"node": self.node, "job_id": self.job_id, "run_id": self.run_id, "ok": self.ok,
                "seconds": round(self.seconds, 6), "time": self.time,
                "checks": {name: c.to_dict() for name, c in self.checks.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeHealth":
        """Inverse of :meth:`to_dict`. Raises KeyError, TypeError or ValueError for another shape."""
        if not isinstance(d, dict) or not isinstance(d.get("checks"), dict):
            raise ValueError("a node health result is a JSON object with a 'checks' object")
        checks = {str(k): CheckResult.from_dict(k, v) for k, v in d["checks"].items()}
        return cls(node=str(d["node"]), job_id=str(d.get("job_id", "")), checks=checks,
                   seconds=float(d.get("seconds", 0.0)), time=float(d.get("time", 0.0)), run_id=d.get("run_id"))


# ---- helpers --------------------------------------------------------------------------------
def _mib(n: float) -> str:
    if abs(n) >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB"


def _env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """``$name`` as a number (``default`` when unset or blank). Raises ValueError naming it otherwise."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number, got {raw!r}") from None
    if not value >= minimum:
        raise ValueError(f"${name} must be >= {minimum:g}, got {raw!r}")
    return value


def _oserror_text(e: OSError) -> str:
    name = errno_mod.errorcode.get(e.errno or 0, f"errno {e.errno}")
    return f"{name} ({e.strerror or e})"


def _safe(text: str, limit: int = 60) -> str:
    from hyperpod_lab.jobdir import safe_name

    return safe_name(text, limit)


_torch_cache: dict[str, Any] = {}

# what the ``gpu`` and ``versions`` checks need of torch, asked of a child interpreter so that this
# node-side process never imports torch itself (``import torch`` is ~1.7 s on a 2-core node)
_TORCH_PROBE = (
    "import json\n"
    "out = {}\n"
    "try:\n"
    "    import torch\n"
    "    out['version'] = torch.__version__\n"
    "    out['cuda'] = torch.version.cuda\n"
    "    try:\n"
    "        out['devices'] = int(torch.cuda.device_count())\n"
    "    except Exception as e:\n"
    "        out['devices_error'] = f'{type(e).__name__}: {e}'\n"
    "except Exception as e:\n"
    "    out['error'] = f'{type(e).__name__}: {e}'\n"
    "print(json.dumps(out))\n"
)


@dataclass(frozen=True)
class TorchFacts:
    """torch as this node's Python sees it: ``version`` (``torch.__version__``), ``cuda`` (the
    CUDA build, None for a CPU build), ``devices`` (``torch.cuda.device_count()``, None when it
    raised: ``devices_error``)."""

    version: str
    cuda: str | None
    devices: int | None
    devices_error: str | None = None


def _torch_facts(timeout_s: float = 120.0) -> tuple[TorchFacts | None, str | None]:
    """``(facts, None)``, or ``(None, why torch does not import)``; probed once per process in a
    child ``sys.executable`` (seconds: torch's import time)."""
    if "facts" not in _torch_cache:
        try:
            res = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True,
                                 timeout=timeout_s)
            got = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {
                "error": f"the torch probe exited {res.returncode}: {res.stderr.strip()[-300:]}"}
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            got = {"error": f"{type(e).__name__}: {e}"}
        if "error" in got:
            _torch_cache["facts"], _torch_cache["error"] = None, str(got["error"])
        else:
            _torch_cache["facts"] = TorchFacts(str(got["version"]), got.get("cuda"), got.get("devices"),
                                               got.get("devices_error"))
            _torch_cache["error"] = None
    return _torch_cache["facts"], _torch_cache["error"]


def _timed(fn, *args, **kwargs) -> CheckResult:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    result.seconds = time.perf_counter() - t0
    return result


# ---- gpu ------------------------------------------------------------------------------------
def _nvidia_smi(fields: tuple[str, ...]) -> subprocess.CompletedProcess:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    return subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)


def _na(value: str) -> bool:
    return value.strip().strip("[]").lower() in ("n/a", "not supported", "unknown error", "")


def _check_gpu(node: str, expect_gpus: int) -> CheckResult:
    if expect_gpus <= 0:
        return CheckResult("gpu", SKIPPED, "no GPU requested")
    want = f"the job needs {expect_gpus} GPU(s) per node"
    try:
        fields = GPU_FIELDS
        proc = _nvidia_smi(fields)
        if proc.returncode != 0 and "not a valid field" in (proc.stdout + proc.stderr):
            fields = GPU_BASIC_FIELDS  # a driver older than the row-remapping fields
            proc = _nvidia_smi(fields)
    except FileNotFoundError:
        return CheckResult("gpu", FAILED, (
            f"node {node}: nvidia-smi is not on PATH and {want}; install the NVIDIA "
            "driver (nvidia-smi) on this node, or exclude the node"), extra={"expected": expect_gpus})
    except subprocess.TimeoutExpired:
        return CheckResult("gpu", FAILED, (
            f"node {node}: nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s ({want}); a hung driver or "
            "GPU: check `dmesg | grep -i xid`, reset the GPU or reboot the node, or exclude it"),
            extra={"expected": expect_gpus})
    except OSError as e:
        return CheckResult("gpu", FAILED, (
            f"node {node}: nvidia-smi could not run: {_oserror_text(e)} ({want}); fix the NVIDIA driver "
            "installation on this node, or exclude it"), extra={"expected": expect_gpus})
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[0][:300]
        return CheckResult("gpu", FAILED, (
            f"node {node}: nvidia-smi exited with {proc.returncode}: {said} ({want}); check the NVIDIA driver "
            "(`nvidia-smi`, `dmesg | grep -i nvrm`), reboot the node, or exclude it"),
            extra={"expected": expect_gpus, "returncode": proc.returncode})
    gpus: list[dict[str, Any]] = []
    problems: list[str] = []
    for row in csv.reader(proc.stdout.splitlines(), skipinitialspace=True):
        if not row:
            continue
        g = {f: (None if _na(v) else v.strip()) for f, v in zip(fields, row)}
        gpus.append(g)
        label = f"GPU {g.get('index')} ({g.get('name')}, {g.get('pci.bus_id')})"
        ecc = g.get("ecc.errors.uncorrected.volatile.total")
        if ecc is not None and ecc.isdigit() and int(ecc) > 0:
            problems.append(f"{label} has {ecc} uncorrected ECC error(s) since the driver loaded: reset the GPU "
                            "(`nvidia-smi -r`) or drain the node")
        for f, what in (("retired_pages.pending", "a retired page pending"),
                        ("remapped_rows.pending", "a row remapping pending")):
            if (g.get(f) or "").lower() in ("yes", "1"):
                problems.append(f"{label} has {what}: reset the GPU (`nvidia-smi -r`) or reboot the node")
        if (g.get("remapped_rows.failure") or "").lower() in ("yes", "1"):
            problems.append(f"{label} failed a row remapping: the GPU needs replacing, exclude the node")
    extra: dict[str, Any] = {"expected": expect_gpus, "gpus": gpus, "visible": len(gpus)}
    if len(gpus) < expect_gpus:
        problems.insert(0, f"nvidia-smi lists {len(gpus)} GPU(s) but {want}: a GPU may have fallen off the bus "
                           "(check `dmesg | grep -i xid`); reboot the node, or exclude it")
    torch, why = _torch_facts()
    if torch is not None:
        count = torch.devices
        if count is None:  # a broken CUDA runtime
            count, problems = 0, problems + [f"torch.cuda.device_count() raised {torch.devices_error}"]
        extra["torch_devices"] = count
        if count < expect_gpus:
            cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
            build = (f" (torch {torch.version} is a CPU-only build: install a CUDA build)" if not torch.cuda
                     else "")
            problems.append(f"torch sees {count} CUDA device(s) but {want}{build}; "
                            f"CUDA_VISIBLE_DEVICES={cvd!r}: ask Slurm for the GPUs (--gpus-per-node) or fix the driver")
    else:
        extra["torch_devices"] = None
        extra["torch_error"] = why
    if problems:
        return CheckResult("gpu", FAILED, f"node {node}: " + "; ".join(problems), extra=extra)
    names = sorted({str(g.get("name")) for g in gpus})
    torch_part = (f", torch sees {extra['torch_devices']}" if extra["torch_devices"] is not None
                  else " (torch not importable: its device count is not checked)")
    return CheckResult("gpu", PASSED, f"{len(gpus)} GPU(s) ({', '.join(names)}), none with errors{torch_part}",
                       extra=extra)


# ---- shm ------------------------------------------------------------------------------------
def _load_spec(spec_path: str) -> tuple[Any, str | None]:
    from hyperpod_lab.spec import JobSpec, SpecError

    try:
        with open(spec_path) as f:
            return JobSpec.from_json(f.read()), None
    except (OSError, SpecError) as e:
        return None, str(e)


#: how much of the end of each rank's event file :func:`measured_shm_bytes` reads, bytes (its
#: newest memory and peer checkpoints: about 60 events of 250 bytes)
SHM_TAIL_BYTES = 16 << 10


def measured_shm_bytes(job_dir: str) -> tuple[int, int]:
    """The most shared memory this job's ranks held on one node at their newest memory
    checkpoints, from its own events.

    Reads the ``checkpoint.saved`` events of tier ``memory`` in the newest
    :data:`SHM_TAIL_BYTES` of each rank's event file (:func:`hyperpod_lab.events.tail_events`:
    every node's check runs at each start of the job, so its read is bounded by the ranks, not
    by the job's age; issue 27), sums ``memory_bytes`` over the ranks of each (node, step) (each
    rank counted once, its largest value) and returns the largest sum.

    Returns:
        ``(bytes, events)``: the largest per-node sum (0 when there is none) and how many memory
        events were read.
    """
    per: dict[tuple[str, Any], dict[Any, int]] = collections.defaultdict(dict)
    seen = 0
    for ev in tail_events(job_dir, SHM_TAIL_BYTES, prefix=RANK_WRITER_PREFIX, needle=b'"tier":"memory"'):
        if ev.kind != EventKind.CHECKPOINT_SAVED.value or ev.data.get("tier") != TIER_MEMORY:
            continue
        mb = ev.data.get("memory_bytes")
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb < 0:
            continue
        seen += 1
        ranks = per[(str(ev.data.get("node")), ev.data.get("step"))]
        rank = ev.data.get("rank", ev.writer)
        ranks[rank] = max(ranks.get(rank, 0), int(mb))
    return max((sum(r.values()) for r in per.values()), default=0), seen


def _existing_ancestor(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _reclaimed_text(reclaimed: list[Reclaimed]) -> str:
    if not reclaimed:
        return ""
    total = sum(r.bytes for r in reclaimed)
    ids = ", ".join(r.job_id for r in reclaimed[:5]) + (f" and {len(reclaimed) - 5} more" if len(reclaimed) > 5 else "")
    return f"; freed {_mib(total)} ({total} bytes) of {len(reclaimed)} ended job(s)' snapshots ({ids})"


def _check_shm(job_dir: str, job_id: str, node: str, shm_bytes: int | None, shm_root: str,
               spec_path: str) -> CheckResult:
    # first, the memory tier of this user's jobs that are over (cancelled, failed, timed out: their
    # ranks were killed before they could delete it); see hyperpod_lab.node.shm_reclaim
    reclaimed = reclaim_ended_jobs(shm_root, os.path.dirname(os.path.abspath(job_dir)), _safe(job_id, 100))
    result = _check_shm_space(job_dir, job_id, node, shm_bytes, shm_root, spec_path)
    if reclaimed:
        result.detail += _reclaimed_text(reclaimed)
        result.extra["reclaimed"] = [r.as_dict() for r in reclaimed]
    return result


def _check_shm_space(job_dir: str, job_id: str, node: str, shm_bytes: int | None, shm_root: str,
                     spec_path: str) -> CheckResult:
    spec, spec_error = _load_spec(spec_path)
    if spec is not None and spec.checkpoint.memory_every_steps is None and spec.resiliency.recovery != RECOVERY_CHECKPOINTLESS:
        return CheckResult("shm", SKIPPED, "the job has no memory tier (checkpoint.memory_every_steps is unset and "
                                           "recovery is not checkpointless)")
    extra: dict[str, Any] = {}
    if shm_bytes is not None:
        needed, extra["budget_from"] = int(shm_bytes), "--shm-bytes"
    else:
        try:
            floor = int(_env_float(ENV_HEALTH_MIN_SHM_BYTES, DEFAULT_MIN_SHM_BYTES))
        except ValueError as e:
            return CheckResult("shm", FAILED, f"node {node}: {e}; fix the variable or unset it")
        measured, n_events = measured_shm_bytes(job_dir)
        if spec is None and n_events == 0:
            return CheckResult("shm", SKIPPED, f"cannot tell whether the job uses the memory tier: its spec is not "
                                               f"readable ({spec_error}) and it saved no memory checkpoint yet")
        needed = max(measured, floor)
        extra.update(measured_bytes=measured, floor_bytes=floor,
                     budget_from="events" if measured > floor else f"${ENV_HEALTH_MIN_SHM_BYTES} floor")
    node_dir = os.path.join(shm_root, _safe(job_id, 100), _safe(node))
    where = _existing_ancestor(node_dir)
    try:
        st = os.statvfs(where)
    except OSError as e:
        return CheckResult("shm", FAILED, (
            f"node {node}: cannot stat the memory tier's file system at {where}: {_oserror_text(e)}; "
            f"check /dev/shm on this node or set ${ENV_SHM_DIR}"), extra={**extra, "path": where})
    free = st.f_bavail * st.f_frsize
    held = held_bytes(node_dir) if os.path.isdir(node_dir) else 0
    extra.update(path=where, node_dir=node_dir, free_bytes=free, held_bytes=held, needed_bytes=needed,
                 total_bytes=st.f_blocks * st.f_frsize)
    held_text = f" plus {_mib(held)} ({held} bytes) the job already holds there" if held else ""
    if free + held < needed:
        return CheckResult("shm", FAILED, (
            f"node {node}: {where} has {_mib(free)} ({free} bytes) free{held_text}, the memory tier needs "
            f"{_mib(needed)} ({needed} bytes); free space there (old jobs' snapshots under {shm_root}), give the "
            f"node a larger /dev/shm, or lower checkpoint.keep_last or leave checkpoint.memory_every_steps unset"),
            extra=extra)
    return CheckResult("shm", PASSED, f"{where} has {_mib(free)} free{held_text}, the memory tier needs {_mib(needed)}",
                       extra=extra)


# ---- storage --------------------------------------------------------------------------------
_STORAGE_FIX = {
    errno_mod.EROFS: "the job directory's file system is read-only on this node: remount it read-write, or exclude "
                     "the node",
    errno_mod.EACCES: "the job's user may not write there: fix the directory's owner or mode",
    errno_mod.EPERM: "the job's user may not write there: fix the directory's owner or mode",
    errno_mod.ENOSPC: "the shared file system is full: free space on it",
    errno_mod.EDQUOT: "the job's user is over its quota on the shared file system: free space or raise the quota",
}


def _check_storage(job_dir: str, node: str) -> tuple[CheckResult, dict[str, float] | None]:
    d = JobPaths(job_dir).health_probe_dir(_safe(node))
    path = os.path.join(d, f"probe-{os.getpid()}-{os.urandom(4).hex()}")
    data = os.urandom(PROBE_BYTES)
    step, target, created = "create the directory", d, False
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        step, target = "create the probe file", path
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        created = True
        try:
            step = "write the probe file"
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            step = "fsync the probe file"
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - t0
        written_at = time.time()
        step = "stat the probe file"
        mtime = os.stat(path).st_mtime
        step = "read the probe file back"
        t1 = time.perf_counter()
        with open(path, "rb") as f:
            back = f.read()
        read_s = time.perf_counter() - t1
        step = "delete the probe file"
        os.unlink(path)
        created = False
    except OSError as e:
        fix = _STORAGE_FIX.get(e.errno or 0, "check the shared file system's mount on this node, or exclude the node")
        return CheckResult("storage", FAILED, (
            f"node {node}: could not {step} {target}: {_oserror_text(e)}; {fix}"),
            extra={"path": target, "errno": errno_mod.errorcode.get(e.errno or 0)}), None
    finally:
        if created:
            try:
                os.unlink(path)
            except OSError:
                pass
    extra = {"path": d, "bytes": PROBE_BYTES, "write_s": round(write_s, 6), "read_s": round(read_s, 6)}
    if back != data:
        return CheckResult("storage", FAILED, (
            f"node {node}: the probe file {path} read back {len(back)} bytes that differ from the {PROBE_BYTES} "
            "written: the shared file system is corrupting data on this node; exclude it and check the mount"),
            extra=extra), None
    return (CheckResult("storage", PASSED, f"wrote, fsynced, read back and deleted {_mib(PROBE_BYTES)} in {d} "
                                           f"(write+fsync {write_s * 1000:.1f} ms)", extra=extra),
            {"written_at": written_at, "mtime": mtime})


# ---- versions -------------------------------------------------------------------------------
def _check_versions(node: str, expect_version: str | None, expect_torch: str | None) -> CheckResult:
    from hyperpod_lab._version import __version__

    torch, why = _torch_facts()
    versions = {"hyperpod_lab": __version__, "torch": torch.version if torch else None,
                "torch_cuda": torch.cuda if torch else None,
                "python": ".".join(map(str, sys.version_info[:3]))}
    versions = {k: (str(v) if v is not None else None) for k, v in versions.items()}
    extra = {"versions": versions, "expected": {"hyperpod_lab": expect_version, "torch": expect_torch}}
    problems, skipped = [], []
    if expect_version is None:
        skipped.append("no hyperpod-lab version expected")
    elif __version__ != expect_version:
        problems.append(f"hyperpod-lab {__version__} is installed but the job expects {expect_version}: install "
                        f"hyperpod-lab=={expect_version} into {sys.executable}'s environment")
    if torch is None:
        problems.append(f"torch does not import ({why}): install torch into {sys.executable}'s environment")
    elif expect_torch is None:
        skipped.append("no torch version expected")
    elif versions["torch"] != expect_torch:
        problems.append(f"torch {versions['torch']} is installed but the job expects {expect_torch}: install "
                        f"torch=={expect_torch} into {sys.executable}'s environment")
    found = ", ".join(f"{k} {v}" for k, v in versions.items())
    if problems:
        return CheckResult("versions", FAILED, f"node {node}: " + "; ".join(problems) + f" (found {found})",
                           extra=extra)
    if expect_version is None and expect_torch is None:
        return CheckResult("versions", SKIPPED, f"no version expected (found {found})", extra=extra)
    return CheckResult("versions", PASSED, f"{found}" + (f"; {', '.join(skipped)}" if skipped else ""), extra=extra)


# ---- clock ----------------------------------------------------------------------------------
def _check_clock(node: str, probe: dict[str, float] | None, max_skew_s: float) -> CheckResult:
    if probe is None:
        return CheckResult("clock", SKIPPED, "the storage check failed: no timestamp of the shared storage to "
                                             "compare with", extra={"max_skew_s": max_skew_s})
    skew = probe["written_at"] - probe["mtime"]
    extra = {"skew_s": round(skew, 6), "max_skew_s": max_skew_s}
    if abs(skew) > max_skew_s:
        ahead = "ahead of" if skew > 0 else "behind"
        return CheckResult("clock", FAILED, (
            f"node {node}: its clock is {abs(skew):.3f} s {ahead} the shared storage's (more than "
            f"{max_skew_s:g} s): enable time sync on the node (chrony/NTP, e.g. the Amazon Time Sync Service "
            f"169.254.169.123) or exclude it"), extra=extra)
    return CheckResult("clock", PASSED, f"skew {skew * 1000:+.1f} ms against the shared storage "
                                        f"(limit {max_skew_s:g} s)", extra=extra)


# ---- the checks together ----------------------------------------------------------------------
def check_node(job_dir: str, job_id: str, node: str, *, expect_gpus: int = 0, shm_bytes: int | None = None,
               shm_root: str | None = None, expect_version: str | None = None, expect_torch: str | None = None,
               max_clock_skew_s: float | None = None, spec_path: str | None = None) -> NodeHealth:
    """Run every check for ``node`` of job ``job_id`` and return the results (no events, no result file).

    Args:
        job_dir: the job directory (local path; the storage probe goes to ``<job_dir>/health/<node>/``).
        job_id: the job id (names the memory tier's directory ``<shm_root>/<job_id>/<node>``).
        node: this node's name.
        expect_gpus: GPUs the node must have; 0 skips the ``gpu`` check.
        shm_bytes: the shared-memory budget in bytes, or None to measure it from the job's events
            (floor ``$HYPERPOD_LAB_HEALTH_MIN_SHM_BYTES``, default 64 MiB).
        shm_root: the memory tier's root; None: ``$HYPERPOD_LAB_SHM_DIR``, else ``/dev/shm/hyperpod-lab``.
        expect_version: the hyperpod-lab version the node must run, or None (not checked).
        expect_torch: the torch version the node must run, or None (not checked; torch must still import).
        max_clock_skew_s: largest allowed ``|skew|`` in seconds; None:
            ``$HYPERPOD_LAB_HEALTH_MAX_CLOCK_SKEW_S``, else 2.0.
        spec_path: the job's ``spec.json``; None: ``$HYPERPOD_LAB_SPEC``, else ``<job_dir>/spec.json``.

    Returns:
        a :class:`NodeHealth` with one :class:`CheckResult` per name in :data:`CHECKS`.

    Raises:
        ValueError: ``$HYPERPOD_LAB_HEALTH_MAX_CLOCK_SKEW_S`` is not a number >= 0 (a bad
            ``$HYPERPOD_LAB_HEALTH_MIN_SHM_BYTES`` fails the ``shm`` check instead).
    """
    t0, mono0 = time.time(), time.perf_counter()
    if max_clock_skew_s is None:
        max_clock_skew_s = _env_float(ENV_HEALTH_MAX_CLOCK_SKEW_S, DEFAULT_MAX_CLOCK_SKEW_S)
    if shm_root is None:
        from hyperpod_lab.jobdir import shm_root as default_shm_root

        shm_root = default_shm_root()
    if spec_path is None:
        spec_path = os.environ.get(ENV_SPEC) or JobPaths(job_dir, join=os.path.join).spec
    checks: dict[str, CheckResult] = {}
    checks["gpu"] = _timed(_check_gpu, node, int(expect_gpus))
    checks["shm"] = _timed(_check_shm, job_dir, job_id, node, shm_bytes, shm_root, spec_path)
    t = time.perf_counter()
    checks["storage"], probe = _check_storage(job_dir, node)
    checks["storage"].seconds = time.perf_counter() - t
    checks["versions"] = _timed(_check_versions, node, expect_version, expect_torch)
    checks["clock"] = _timed(_check_clock, node, probe, float(max_clock_skew_s))
    for c in checks.values():  # one line each: the supervisor reads them from srun's output
        c.detail = " ".join(c.detail.split())
    return NodeHealth(node=node, job_id=job_id, checks=checks, seconds=time.perf_counter() - mono0,
                      time=max(t0, time.time()))


# ---- results across nodes ---------------------------------------------------------------------
def results_dir(job_dir: str, run_id: str) -> str:
    """``<job_dir>/health/<run_id>``: where a run's per-node result files go."""
    return JobPaths(job_dir).health_results(run_id)


def result_path(job_dir: str, run_id: str, node: str) -> str:
    """``<job_dir>/health/<run_id>/<node>.json``."""
    return JobPaths(job_dir).health_result(run_id, _safe(node))


def load_results(job_dir: str, run_id: str) -> list[NodeHealth]:
    """Every node's result of run ``run_id``, sorted by node.

    Reads the regular files ``<job_dir>/health/<run_id>/*.json`` (links and temporary files are
    ignored). A file that is not a :class:`NodeHealth` is returned as the node (its file name)
    failing a check named ``report`` whose detail names the file and the error, so a broken
    report is never mistaken for a healthy node.

    Returns:
        [] when the directory does not exist.

    Raises:
        ValueError: ``run_id`` is not ``[A-Za-z0-9_.-]{1,100}``.
    """
    if not _RUN_ID_RE.match(run_id):
        raise ValueError(f"health run id {run_id!r} must match {_RUN_ID_RE.pattern}")
    d = results_dir(job_dir, run_id)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # a link, or vanished
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            with os.fdopen(fd, "rb", closefd=False) as f:
                raw = f.read()
            out.append(NodeHealth.from_dict(json.loads(raw)))
        except (ValueError, KeyError, TypeError, OSError) as e:
            node = name[:-5]
            out.append(NodeHealth(node=node, job_id="", run_id=run_id, seconds=0.0, time=0.0, checks={
                "report": CheckResult("report", FAILED, f"node {node}: its health report {path} is not readable: "
                                                        f"{type(e).__name__}: {e}; rerun the health check")}))
        finally:
            os.close(fd)
    return sorted(out, key=lambda h: h.node)


def summarize(results: list[NodeHealth]) -> dict[str, list[tuple[str, str]]]:
    """The failed nodes of a run and why, across nodes.

    Besides each node's own failed checks, every node must report the same torch (and
    hyperpod-lab) version: a node whose version differs from the majority's fails ``versions``;
    when no version has a strict majority, every node with a version fails (nobody can tell
    which is right). Nodes that report no version (torch not importable: already failed) do not vote.

    Args:
        results: one :class:`NodeHealth` per node (e.g. :func:`load_results`).

    Returns:
        failed node -> [(check name, detail), ...] in check order, cross-node findings last;
        nodes with no failure are absent (an empty dict: every node is fit).
    """
    failed: dict[str, list[tuple[str, str]]] = {}
    for h in results:
        for c in h.failed:
            failed.setdefault(h.node, []).append((c.name, c.detail))
    for key, label in (("torch", "torch"), ("hyperpod_lab", "hyperpod-lab")):
        found: dict[str, str] = {}
        for h in results:
            v = (h.checks.get("versions") or CheckResult("versions", SKIPPED, "")).extra.get("versions", {}) or {}
            if v.get(key):
                found[h.node] = str(v[key])
        counts = collections.Counter(found.values())
        if len(counts) <= 1:
            continue
        ranked = counts.most_common()
        majority = ranked[0][0] if ranked[0][1] > len(found) / 2 else None
        spread = ", ".join(f"{n}: {ver}" for n, ver in sorted(found.items()))
        for node, ver in sorted(found.items()):
            if ver == majority:
                continue
            if majority is not None:
                detail = (f"node {node} runs {label} {ver} but {counts[majority]} of {len(found)} nodes run "
                          f"{majority}: install {label}=={majority} on {node}, or exclude it ({spread})")
            else:
                detail = (f"node {node} runs {label} {ver} and no version is on a majority of the {len(found)} "
                          f"nodes ({spread}): install one version on every node")
            failed.setdefault(node, []).append(("versions", detail))
    return failed


# ---- CLI --------------------------------------------------------------------------------------
def _line(node: str, c: CheckResult) -> str:
    return f"hyperpod-lab: health {node}: {c.name} {c.status} ({c.seconds:.3f} s): {c.detail}"


def main(argv: list[str] | None = None) -> int:
    """``python -m hyperpod_lab.node.health``: check this node, record the result, exit 0/1/2
    (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.node.health",
                                description="Pre-flight health checks of this node for a hyperpod-lab job.")
    p.add_argument("--node-run-id", required=True, help="the supervisor's run id ([A-Za-z0-9_.-]); results go to "
                                                        "<job_dir>/health/<run id>/<node>.json")
    p.add_argument("--expect-gpus", type=int, default=0, help="GPUs this node must have (0: no gpu check)")
    p.add_argument("--shm-bytes", type=int, default=None, help="shared-memory budget of the memory tier, bytes "
                                                               "(default: measured from the job's events)")
    p.add_argument("--expect-version", default=None, help="hyperpod-lab version the node must run")
    p.add_argument("--expect-torch", default=None, help="torch version the node must run")
    args = p.parse_args(argv)
    if not _RUN_ID_RE.match(args.node_run_id):
        p.error(f"--node-run-id {args.node_run_id!r} must match {_RUN_ID_RE.pattern}")
    if args.expect_gpus < 0 or (args.shm_bytes is not None and args.shm_bytes < 0):
        p.error("--expect-gpus and --shm-bytes must be >= 0")
    job_dir = os.environ.get(ENV_JOB_DIR)
    if not job_dir:
        print(f"hyperpod-lab: health: ${ENV_JOB_DIR} is not set; run this inside a hyperpod-lab job "
              "(the supervisor sets it)", file=sys.stderr)
        return 2
    from hyperpod_lab.atomicfile import write_json_atomic
    from hyperpod_lab.jobdir import node_name

    job_id = os.environ.get(ENV_JOB_ID) or os.path.basename(os.path.normpath(job_dir))
    node = node_name()
    try:
        health = check_node(job_dir, job_id, node, expect_gpus=args.expect_gpus, shm_bytes=args.shm_bytes,
                            expect_version=args.expect_version, expect_torch=args.expect_torch)
    except ValueError as e:
        print(f"hyperpod-lab: health {node}: {e}", file=sys.stderr)
        return 2
    health.run_id = args.node_run_id
    for c in health.checks.values():
        print(_line(node, c), flush=True)
    n_failed = len(health.failed)
    print(f"hyperpod-lab: health {node}: {'ok' if health.ok else 'FAILED'} ({n_failed} of {len(health.checks)} "
          f"checks failed) in {health.seconds:.2f} s", flush=True)
    rc = 0 if health.ok else 1
    record = health.to_dict()
    try:
        writer = EventWriter(job_dir, _safe(health_writer(node), 100), job_id)
        writer.emit(EventKind.HEALTH_CHECKED, node=node, run_id=args.node_run_id, ok=health.ok,
                    checks=record["checks"], seconds=record["seconds"])
        for c in health.failed:
            writer.emit(EventKind.HEALTH_FAILED, node=node, run_id=args.node_run_id, check=c.name, detail=c.detail)
    except OSError as e:
        print(f"hyperpod-lab: health {node}: could not write the health events to {job_dir}/events: "
              f"{_oserror_text(e)}", file=sys.stderr)
        rc = 1
    path = result_path(job_dir, args.node_run_id, node)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_json_atomic(path, record)
    except OSError as e:
        print(f"hyperpod-lab: health {node}: could not write {path}: {_oserror_text(e)}", file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
