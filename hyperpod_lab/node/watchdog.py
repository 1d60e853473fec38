"""Hang detection: each rank's heartbeat, and the launch agent's watchdog that reads it.

**Heartbeat (in every rank).** :class:`HeartbeatWriter` is a small fixed-size file in a
node-local, private directory on ``/dev/shm`` (``$HYPERPOD_LAB_HEARTBEAT_DIR``, set by the launch
agent; ``local-<L>.hb`` for local rank L), mapped into the rank's memory: a beat is a few stores
into that mapping (about a microsecond, no system call, nothing on shared storage). It holds the
last step (index, monotonic time, its duration split into compute and waiting), the section the
rank is in (``with ctx.section("forward")``: name, entered time, whether it waits in a
collective, its own timeout) and a ring of the last :data:`RING` steps' timings that the agent
reads for the job's step-time statistics and for straggler detection
(:mod:`hyperpod_lab.node.straggler`). A sequence counter (odd while a beat is being written)
lets the agent read a consistent copy without a lock. Times are ``time.monotonic()`` seconds
(``CLOCK_MONOTONIC``: one clock for every process of a Linux host).

**Watchdog (in the launch agent).** :class:`Watchdog` runs inside torchrun's monitor loop
(every ``--monitor-interval``, 0.1 s by default). Every rank is armed from its first beat (the
heartbeat file ``hp.init()`` creates): a local rank is *hung* when it made no progress (no step,
no section entered or left) for its budget, which is, in order:

* inside a section opened with ``timeout_s``: that timeout (``timeout_source: "section"``);
* before the first step of this start of the rank (start-up: model build, restore or heal,
  compilation): the start-up budget S, ``resiliency.startup_timeout_s``, else
  :data:`STARTUP_TIMEOUT_S` (600 s) (``"startup"``);
* T = ``resiliency.hang_timeout_s`` when the spec sets it (``"spec"``);
* T = ``max(HANG_FLOOR_S, HANG_FACTOR x p99)`` of the job's own step times (30 s and 10 by
  default), once :data:`MIN_SAMPLES` step times were measured and this start of the rank made
  more than :data:`WARMUP_STEPS` steps (``"derived"``); the first :data:`WARMUP_STEPS` steps of
  every start (start-up, compilation, a restore or heal) are never samples;
* until then (the first steps of every start): ``max(min(HANG_FLOOR_S, S), HANG_FACTOR x`` the
  slowest step of this start so far``)`` (the first step's time runs from ``hp.init()``, so it
  holds the start-up's model build and compilation), and at least the derived T when there is
  one (``"early"``).

A rank that waits in a collective (a section opened with ``wait=True``, e.g. the checkpointless
all-reduce and quorum) gets :data:`VICTIM_FACTOR` x its budget: the peer it waits for is usually
the hung one, and that peer's own watchdog acts first. So does a running rank under the
``startup`` or ``early`` budget: in its first steps nothing tells a rank blocked in a collective
behind a stopped peer (e.g. plain DDP's all-reduce on another node) from a hung one. A stopped
process (SIGSTOP, ``/proc`` state ``T``) is always judged at its budget: it cannot be anyone's
victim.

**Stopped ranks are killed at once.** When torchrun stops its worker group (a peer failed or
left first, e.g. its collective timed out), it sends SIGTERM and waits up to 30 s before SIGKILL;
a stopped process cannot act on SIGTERM, so that grace is pure loss. :meth:`Watchdog.stop_group`
(called by the launch agent just before) handles each stopped local rank as a hang at once
(stacks, ``fault.detected`` {reason: "hang", timeout_source: "group-stop"}, SIGKILL).

On a hang it (1) dumps the rank's Python stacks with ``py-spy dump`` (``--nonblocking`` for a
stopped process, which ``py-spy`` cannot suspend), or, without py-spy, has the rank dump them
itself with :mod:`faulthandler` (``SIGUSR1``, registered by ``hp.init()``; a stopped process is
continued for it), and says which; (2) emits ``fault.detected`` {reason: "hang", rank,
local_rank, node, stalled_s, section, hang_timeout_s, timeout_source, process_state, stacks,
log_file, pid, detected_by: "watchdog", root_cause: true}; (3) SIGKILLs the rank, so torchrun
restarts it like a crashed worker (checkpointless: the restarted group heals from its peers);
(4) appends the stacks to the rank's log (``stdout.log`` of its attempt) and to the agent's own
output (the job's log). The crash that follows is reported by the agent as usual, with
``reason: "killed by the hang watchdog ..."`` and ``root_cause: false``.

Limits: a rank is judged on its own progress; in a job without wait sections (plain DDP), a
rank blocked in a collective behind a hung peer stalls at the same time and may be reported (and
restarted) too, which torchrun's restart of the worker group does anyway. Anything that runs
longer than T between two steps outside a section with its own timeout (an evaluation loop, a
long synchronous save) must be wrapped: ``with ctx.section("eval", timeout_s=900): ...``.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from hyperpod_lab.events import FaultReason

HANG_FLOOR_S = 30.0
"""Smallest derived hang timeout T, seconds."""
HANG_FACTOR = 10.0
"""Derived T is this many times the p99 step time (above the floor)."""
WARMUP_STEPS = 5
"""The first steps of every start of a rank: never step-time samples, and (derived T) not watched."""
MIN_SAMPLES = 20
"""Step-time samples (after warm-up) before a derived T exists."""
HISTORY = 2000
"""Step-time samples kept for the p99 (the newest)."""
VICTIM_FACTOR = 2.0
"""A rank waiting in a collective (a ``wait`` section) is hung only after this many T."""
DUMP_TIMEOUT_S = 20.0
"""Most seconds a ``py-spy dump`` may take."""
NATIVE_DUMP_TIMEOUT_S = 5.0
"""Most seconds the second, ``--native`` dump of a running hung rank may take (after the report)."""
FAULTHANDLER_SIGNAL = signal.SIGUSR1
"""What ``hp.init()`` registers :func:`faulthandler.register` on (stacks to the rank's stdout)."""
FAULTHANDLER_WAIT_S = 1.0
"""Seconds the watchdog gives a rank to write its faulthandler stacks before killing it."""
STARTUP_TIMEOUT_S = 600.0
"""Start-up budget (s) when the spec sets no ``resiliency.startup_timeout_s``: NCCL's default
collective timeout (``init_process_group``'s documented 10 min), so the watchdog is never later
than a start-up hang NCCL would catch, and a slow first start (a large restore, a compile) is
not killed."""
EARLY_SOURCES = ("startup", "early")
"""Budgets under which a running (not stopped) rank gets :data:`VICTIM_FACTOR` x its budget."""

RING = 256
"""Steps' timings kept in a heartbeat's ring (the agent reads them at least every few seconds)."""
MAGIC = b"HPHB"
VERSION = 1
SECTION_BYTES = 48

_ID = struct.Struct("<4sI")            # offset 0: magic, version
_SEQ = struct.Struct("<Q")             # offset 8: sequence counter (odd while writing)
_BODY = struct.Struct("<qqqQddqdddddddd48sB7xQ")  # offset 16
# pid, global_rank, local_rank, steps, last_progress, last_step_time, step, step_s, compute_s,
# wait_s, slow_factor, progress_wall, section_since, section_timeout, (spare), section, section_wait,
# ring_count
_ENTRY = struct.Struct("<qddd")        # step, step_s, compute_s, wait_s
_BODY_OFF = 16
_RING_OFF = _BODY_OFF + _BODY.size
SIZE = _RING_OFF + RING * _ENTRY.size


def heartbeat_file(directory: str, local_rank: int) -> str:
    """``<directory>/local-<local_rank>.hb``."""
    return os.path.join(directory, f"local-{int(local_rank)}.hb")


def default_heartbeat_root() -> str:
    """Where agents make their heartbeat directories: ``/dev/shm`` (node-local memory) when it is a
    writable directory, else the temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class HeartbeatWriter:
    """One rank's heartbeat file, mapped (see the module doc). Not thread-safe: beat from the
    training thread (``JobContext`` does).

    Args:
        path: the file (created 0600, truncated; a link is refused).
        global_rank, local_rank: who beats.

    Raises:
        OSError: the file cannot be created or mapped; ENOSPC ("no space ...") when its file
            system (``/dev/shm``) cannot hold it: its space is reserved (``posix_fallocate``)
            before it is mapped, since a store into an unbacked page of a full tmpfs is a SIGBUS
            that kills the rank (the file is removed again).
    """

    def __init__(self, path: str, global_rank: int, local_rank: int):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                os.ftruncate(fd, SIZE)
                os.posix_fallocate(fd, 0, SIZE)
            except OSError as e:
                try:
                    os.unlink(path)
                except OSError:
                    pass
                if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise
                raise OSError(e.errno, f"no space for the {SIZE}-byte heartbeat file ({os.strerror(e.errno)}); "
                              f"free space in its directory's file system (/dev/shm on the node)", path) from None
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self.f: dict[str, Any] = {
            "pid": os.getpid(), "global_rank": int(global_rank), "local_rank": int(local_rank), "steps": 0,
            "last_progress": time.monotonic(), "last_step_time": 0.0, "step": -1, "step_s": 0.0, "compute_s": 0.0,
            "wait_s": 0.0, "slow_factor": 1.0, "progress_wall": time.time(), "section_since": 0.0,
            "section_timeout": 0.0, "section": "", "section_wait": False, "ring_count": 0}
        _ID.pack_into(self._mm, 0, MAGIC, VERSION)
        self._write(None)

    def _write(self, entry: tuple | None) -> None:
        f = self.f
        self._seq += 1
        _SEQ.pack_into(self._mm, 8, self._seq)  # odd: being written
        if entry is not None:
            _ENTRY.pack_into(self._mm, _RING_OFF + (f["ring_count"] % RING) * _ENTRY.size, *entry)
            f["ring_count"] += 1
        _BODY.pack_into(self._mm, _BODY_OFF, f["pid"], f["global_rank"], f["local_rank"], f["steps"],
                        f["last_progress"], f["last_step_time"], f["step"], f["step_s"], f["compute_s"],
                        f["wait_s"], f["slow_factor"], f["progress_wall"], f["section_since"], f["section_timeout"],
                        0.0, f["section"].encode("utf-8", "replace")[:SECTION_BYTES], int(bool(f["section_wait"])),
                        f["ring_count"])
        self._seq += 1
        _SEQ.pack_into(self._mm, 8, self._seq)

    def step(self, step: int, step_s: float, compute_s: float, wait_s: float, slow_factor: float = 1.0,
             now: float | None = None) -> None:
        """A completed step: its 0-based index and duration (s), split into computing and waiting."""
        now = time.monotonic() if now is None else now
        f = self.f
        f.update(steps=f["steps"] + 1, last_progress=now, last_step_time=now, step=int(step), step_s=float(step_s),
                 compute_s=float(compute_s), wait_s=float(wait_s), slow_factor=float(slow_factor),
                 progress_wall=time.time())
        self._write((int(step), float(step_s), float(compute_s), float(wait_s)))

    def section(self, name: str | None, *, wait: bool = False, timeout_s: float | None = None,
                now: float | None = None) -> None:
        """The rank entered section ``name`` (None: it left every section). Both count as progress."""
        now = time.monotonic() if now is None else now
        self.f.update(section=name or "", section_wait=bool(wait) if name else False,
                      section_timeout=float(timeout_s or 0.0) if name else 0.0,
                      section_since=now if name else 0.0, last_progress=now, progress_wall=time.time())
        self._write(None)

    def close(self, unlink: bool = False) -> None:
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        if unlink:
            try:
                os.unlink(self.path)
            except OSError:
                pass


@dataclass
class Beat:
    """A consistent copy of a heartbeat (see :class:`HeartbeatWriter` for the fields; times are
    monotonic seconds, durations seconds)."""

    pid: int
    global_rank: int
    local_rank: int
    steps: int
    last_progress: float
    last_step_time: float
    step: int
    step_s: float
    compute_s: float
    wait_s: float
    slow_factor: float
    progress_wall: float
    section_since: float
    section_timeout: float
    section: str | None
    section_wait: bool
    ring_count: int
    entries: list[tuple[int, float, float, float]]


def read_heartbeat(path: str, since: int | None = None, tries: int = 50) -> Beat | None:
    """Read a heartbeat file; None when it is missing, not a heartbeat, or kept changing.

    Args:
        since: also return the ring entries written after the first ``since`` (the newest
            :data:`RING` at most), oldest first; None: none.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < SIZE:
            return None
        mm = mmap.mmap(fd, SIZE, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    try:
        if _ID.unpack_from(mm, 0) != (MAGIC, VERSION):
            return None
        for _ in range(tries):
            s1 = _SEQ.unpack_from(mm, 8)[0]
            if s1 % 2:
                time.sleep(0)
                continue
            body = _BODY.unpack_from(mm, _BODY_OFF)
            entries: list[tuple[int, float, float, float]] = []
            count = body[17]
            if since is not None and count > since:
                first = max(since, count - RING)
                entries = [_ENTRY.unpack_from(mm, _RING_OFF + (i % RING) * _ENTRY.size) for i in range(first, count)]
            if _SEQ.unpack_from(mm, 8)[0] != s1:
                continue
            return Beat(pid=body[0], global_rank=body[1], local_rank=body[2], steps=body[3], last_progress=body[4],
                        last_step_time=body[5], step=body[6], step_s=body[7], compute_s=body[8], wait_s=body[9],
                        slow_factor=body[10], progress_wall=body[11], section_since=body[12], section_timeout=body[13],
                        section=body[15].rstrip(b"\0").decode("utf-8", "replace") or None, section_wait=bool(body[16]),
                        ring_count=count, entries=entries)
        return None
    finally:
        mm.close()


# --------------------------------------------------------------------------- the timeout
def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` (nearest rank). Raises ValueError when empty."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    k = max(0, min(len(xs) - 1, int(-(-q * len(xs) // 100)) - 1))
    return xs[k]


def derived_hang_timeout(samples: Iterable[float], floor_s: float | None = None, factor: float | None = None,
                         min_samples: int | None = None) -> float | None:
    """T = ``max(floor_s, factor x p99(samples))`` seconds, or None with fewer than
    ``min_samples`` step times (s) to go on (defaults: :data:`HANG_FLOOR_S`,
    :data:`HANG_FACTOR`, :data:`MIN_SAMPLES`, read at each call)."""
    floor_s = HANG_FLOOR_S if floor_s is None else floor_s
    factor = HANG_FACTOR if factor is None else factor
    min_samples = MIN_SAMPLES if min_samples is None else min_samples
    xs = list(samples)
    if len(xs) < min_samples:
        return None
    return max(floor_s, factor * percentile(xs, 99))


def process_state(pid: int) -> str | None:
    """The ``/proc/<pid>/stat`` state letter (``R``, ``S``, ``D``, ``T`` stopped, ``t`` traced,
    ``Z``), or None when there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return data.rsplit(b")", 1)[1].split()[0].decode()
    except (IndexError, UnicodeDecodeError):
        return None


def _state_word(state: str | None) -> str:
    return {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped", "t": "traced",
            "Z": "zombie", None: "gone"}.get(state, state or "gone")


def find_py_spy() -> str | None:
    """``py-spy`` next to this interpreter (a virtual environment's ``bin``), else on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def py_spy_dump(pid: int, stopped: bool, py_spy: str | None = None, timeout_s: float = DUMP_TIMEOUT_S,
                native: bool = False) -> tuple[str | None, str]:
    """Python stacks of every thread of ``pid`` by ``py-spy dump``.

    A stopped process cannot be suspended by py-spy (``Failed to suspend process``), so it is read
    with ``--nonblocking``; a running one is suspended while read, falling back to the
    non-blocking dump. ``native``: only ``--native`` (running processes: the C/C++ frames name the
    collective a rank waits in; reading libtorch's symbols can take seconds on a busy node).

    Returns:
        ``(text, how)``: the dump and the command that made it, or ``(None, why)`` when py-spy is
        missing or every attempt failed.
    """
    py_spy = py_spy or find_py_spy()
    if not py_spy:
        return None, "py-spy not found"
    attempts = [["--nonblocking"]] if stopped else ([["--native"]] if native else [[], ["--nonblocking"]])
    why = ""
    for extra in attempts:
        argv = [py_spy, "dump", "--pid", str(int(pid)), *extra]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"{' '.join(argv[1:])}: {e}"
            continue
        if out.returncode == 0 and "Thread" in out.stdout:
            return out.stdout, "py-spy " + " ".join(argv[1:])
        why = f"{' '.join(argv[1:])} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-300:]}"
    return None, why


# --------------------------------------------------------------------------- the watchdog
@dataclass
class Worker:
    """One local worker as the agent knows it."""

    local_rank: int
    global_rank: int
    pid: int
    log_file: str | None = None  # its stdout.log (None: not redirected)


class _Watched:
    """What the watchdog keeps per local worker for one start (attempt)."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.cursor = 0          # ring entries consumed
        self.attempt_steps = 0   # steps seen in this start
        self.slowest = 0.0       # slowest step of this start so far, s (its first one included)
        self.hung = False
        self.last_beat: Beat | None = None


class Watchdog:
    """The launch agent's hang watchdog (and straggler feed) for its local workers.

    Args:
        heartbeat_dir: the directory the workers beat in (``$HYPERPOD_LAB_HEARTBEAT_DIR``).
        node: this node's name (reported as is).
        emit: ``emit(kind, **data)``, the agent's event emitter.
        hang_timeout_s: the spec's ``resiliency.hang_timeout_s`` (seconds), or None to derive T.
        startup_timeout_s: the spec's ``resiliency.startup_timeout_s`` (seconds), or None for
            :data:`STARTUP_TIMEOUT_S`.
        stragglers: a :class:`~hyperpod_lab.node.straggler.StragglerDetector` fed with every
            step after warm-up, or None.
        out: where the agent writes its own lines (default ``sys.stderr``: the job's log).
    """

    def __init__(self, heartbeat_dir: str, node: str, emit: Callable[..., Any], *,
                 hang_timeout_s: float | None = None, startup_timeout_s: float | None = None,
                 stragglers: Any = None, out=None):
        self.dir, self.node, self.emit = heartbeat_dir, node, emit
        self.hang_timeout_s = hang_timeout_s
        self.startup_timeout_s = STARTUP_TIMEOUT_S if startup_timeout_s is None else float(startup_timeout_s)
        self.stragglers = stragglers
        self.out = out
        self.samples: deque[float] = deque(maxlen=HISTORY)
        self.watched: dict[int, _Watched] = {}
        self.killed: dict[int, dict[str, Any]] = {}   # pid -> the hang it was killed for
        self.hangs: list[dict[str, Any]] = []

    # ---- lifecycle ------------------------------------------------------------------------
    def workers_started(self, workers: Iterable[Worker]) -> None:
        """A new start (attempt) of the local workers: watch these, forget the previous ones'."""
        self.watched = {w.local_rank: _Watched(w) for w in workers}

    def timeout(self) -> tuple[float | None, str]:
        """``(T, source)``: the spec's timeout (``"spec"``), the derived one (``"derived"``), or
        ``(None, "warm-up")`` while too few step times were measured."""
        if self.hang_timeout_s is not None:
            return float(self.hang_timeout_s), "spec"
        t = derived_hang_timeout(self.samples)
        return (t, "derived") if t is not None else (None, "warm-up")

    def budget(self, w: _Watched, beat: Beat, sections: bool = True) -> tuple[float, str]:
        """``(seconds, source)``: how long local worker ``w`` (whose newest heartbeat is
        ``beat``) may go without progress now (see the module doc for the rules); ``sections``
        False: as if it were in no section (what a stopped rank gets, :meth:`_judge`)."""
        if sections and beat.section and beat.section_timeout > 0:
            return beat.section_timeout, "section"
        if beat.steps == 0:
            return self.startup_timeout_s, "startup"
        t, source = self.timeout()
        if source == "spec" or (t is not None and w.attempt_steps > WARMUP_STEPS):
            return t, source
        early = max(min(HANG_FLOOR_S, self.startup_timeout_s), HANG_FACTOR * w.slowest)
        return (early if t is None else max(t, early)), "early"

    # ---- the check --------------------------------------------------------------------------
    def check(self, now: float | None = None) -> list[dict[str, Any]]:
        """Read every local worker's heartbeat, feed step times, and handle hung ranks.

        Returns:
            The hangs handled in this call (the ``fault.detected`` data of each).
        """
        hung = []
        if any(w.hung for w in self.watched.values()):
            # a local rank of this start was killed: torchrun stops and restarts the others (they
            # are blocked behind it, or soon will be); none of them is a hang of its own
            if self.stragglers is not None:
                self.stragglers.tick()
            return []
        for w in list(self.watched.values()):
            beat = read_heartbeat(heartbeat_file(self.dir, w.worker.local_rank), since=w.cursor)
            if beat is None or beat.pid != w.worker.pid:
                continue  # not started beating yet (or a previous start's file)
            self._consume(w, beat)
            verdict = self._judge(w, beat, time.monotonic() if now is None else now)
            if verdict is not None:
                hung.append(verdict)
        # a stopped rank is the one its local peers wait for: handle it alone (torchrun then stops
        # and restarts the others); else every hung rank, the longest stalled first
        stopped = [v for v in hung if v[5] in ("T", "t")]
        handled = [self._on_hang(*v) for v in sorted(stopped or hung, key=lambda v: -v[2])]
        if self.stragglers is not None:
            self.stragglers.tick()
        return handled

    def _consume(self, w: _Watched, beat: Beat) -> None:
        if beat.ring_count < w.cursor:  # a new file under the same pid cannot happen; be safe
            w.cursor = 0
        w.cursor = beat.ring_count
        for step, step_s, compute_s, wait_s in beat.entries:
            w.attempt_steps += 1
            w.slowest = max(w.slowest, step_s)
            if w.attempt_steps <= WARMUP_STEPS:
                continue
            self.samples.append(step_s)
            if self.stragglers is not None:
                self.stragglers.add(beat.global_rank, step, step_s, compute_s, wait_s)
        w.last_beat = beat

    def _judge(self, w: _Watched, beat: Beat, now: float) -> tuple | None:
        """``(w, beat, stalled_s, budget, source, process state)`` when the rank is hung, else None."""
        t, source = self.budget(w, beat)
        stalled = now - beat.last_progress
        state = None
        if stalled < t:
            if source != "section" or not beat.section_wait:
                return None
            # a wait section's own timeout spares a rank that waits for a peer (torchft bounds that
            # wait itself); a stopped rank waits for nobody: it gets the budget outside sections
            t, source = self.budget(w, beat, sections=False)
            if stalled < t:
                return None
            state = process_state(w.worker.pid)
            if state not in ("T", "t"):
                return None
        state = state or process_state(w.worker.pid)
        if state in (None, "Z"):
            return None  # gone: torchrun's monitor reports it
        stopped = state in ("T", "t")
        maybe_victim = beat.section_wait or source in EARLY_SOURCES
        if maybe_victim and not stopped and source != "section" and stalled < VICTIM_FACTOR * t:
            return None  # maybe waiting in a collective behind a peer: that peer's watchdog acts first
        return (w, beat, stalled, t, source, state)

    def stop_group(self, now: float | None = None) -> list[dict[str, Any]]:
        """torchrun is about to stop the local workers (SIGTERM, then SIGKILL after its 30 s
        grace): handle every stopped one (``/proc`` state ``T``/``t``, which cannot act on
        SIGTERM) as a hang at once: stacks, ``fault.detected`` {reason: "hang",
        ``timeout_source: "group-stop"``, ``hang_timeout_s``: the budget it was under}, SIGKILL.
        The launch agent calls it before every stop of its worker group. Returns the hangs
        handled (the ``fault.detected`` data of each)."""
        now = time.monotonic() if now is None else now
        handled = []
        for w in list(self.watched.values()):
            if w.hung:
                continue
            state = process_state(w.worker.pid)
            if state not in ("T", "t"):
                continue
            beat = read_heartbeat(heartbeat_file(self.dir, w.worker.local_rank), since=w.cursor)
            if beat is not None and beat.pid == w.worker.pid:
                self._consume(w, beat)
                t, stalled = self.budget(w, beat)[0], now - beat.last_progress
            else:
                beat, t, stalled = None, self.startup_timeout_s, 0.0  # stopped before its first beat
            handled.append(self._on_hang(w, beat, stalled, t, "group-stop", state))
        return handled

    # ---- a hang -----------------------------------------------------------------------------
    def _on_hang(self, w: _Watched, beat: Beat | None, stalled: float, t: float, source: str,
                 state: str | None) -> dict[str, Any]:
        w.hung = True
        pid = w.worker.pid
        stopped = state in ("T", "t")
        rank = beat.global_rank if beat is not None else w.worker.global_rank
        section = beat.section if beat is not None else None
        step = beat.step if beat is not None and beat.step >= 0 else None
        where = (f"section {section!r}" if section else f"after step {step}" if step is not None
                 else "before its first step")
        head = (f"hyperpod-lab: watchdog: rank {rank} (local rank {w.worker.local_rank}, pid {pid}, node {self.node}) "
                f"made no progress for {stalled:.1f} s ({where}; hang timeout {t:.1f} s, {source}; process "
                f"{_state_word(state)})")
        text, how = py_spy_dump(pid, stopped, native=False)  # Python frames: fast, before the report
        method = "py-spy" if text is not None else None
        if text is None:
            method = self._faulthandler(pid, stopped, how)
        data = {"reason": FaultReason.HANG.value, "rank": rank, "local_rank": w.worker.local_rank, "node": self.node,
                "stalled_s": round(stalled, 3), "section": section, "step": step,
                "hang_timeout_s": round(t, 3), "timeout_source": source, "process_state": _state_word(state),
                "stacks": method, "log_file": w.worker.log_file, "pid": pid, "exitcode": None, "signal": None,
                "detected_by": "watchdog", "root_cause": True}
        self.emit("fault.detected", **data)
        self.killed[pid] = data
        self.hangs.append(data)
        if text is not None and not stopped:  # a running rank: its C/C++ frames name the collective it waits in
            native, native_how = py_spy_dump(pid, False, native=True, timeout_s=NATIVE_DUMP_TIMEOUT_S)
            if native is not None:
                text, how = native, native_how
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_gone(pid, 2.0)  # no write of the dying rank can land after the stacks below
        if text is not None:
            body = f"{head}; Python stacks ({how}):\n{text.rstrip()}\n"
        elif method == "faulthandler":
            body = (f"{head}; Python stacks: written above by the rank itself (faulthandler on "
                    f"{FAULTHANDLER_SIGNAL.name}; {how})\n")
        else:
            body = f"{head}; no Python stacks: {how}\n"
        self._say(body + f"hyperpod-lab: watchdog: rank {rank} killed (SIGKILL) to recover it like a crash\n")
        if w.worker.log_file:
            try:
                with open(w.worker.log_file, "a") as f:
                    f.write(body)
            except OSError:
                pass
        return data

    def _faulthandler(self, pid: int, stopped: bool, why: str) -> str | None:
        """Have the rank write its own stacks (faulthandler on :data:`FAULTHANDLER_SIGNAL`, which
        ``hp.init()`` registers); a stopped rank is continued for it. Returns ``"faulthandler"``,
        or None when it could not be signalled."""
        self._say(f"hyperpod-lab: watchdog: {why}; asking pid {pid} for its stacks (faulthandler, "
                  f"{FAULTHANDLER_SIGNAL.name})\n")
        try:
            os.kill(pid, FAULTHANDLER_SIGNAL)
            if stopped:
                os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return None
        time.sleep(FAULTHANDLER_WAIT_S)
        return "faulthandler"

    def _say(self, text: str) -> None:
        out = self.out or sys.stderr
        try:
            out.write(text)
            out.flush()
        except (OSError, ValueError):
            pass

    def killed_reason(self, pid: int | None) -> str | None:
        """For the agent's report of a worker's death: ``"killed by the hang watchdog ..."`` when
        this watchdog killed ``pid``, else None."""
        hang = self.killed.get(pid) if pid is not None else None
        if hang is None:
            return None
        if hang["timeout_source"] == "group-stop":
            return (f"killed by the hang watchdog: stopped ({hang['process_state']}) when its worker group was "
                    f"stopped, no progress for {hang['stalled_s']:.1f} s")
        return (f"killed by the hang watchdog: no progress for {hang['stalled_s']:.1f} s "
                f"(hang timeout {hang['hang_timeout_s']:.1f} s)")


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process_state(pid) not in (None, "Z"):
        time.sleep(0.01)
