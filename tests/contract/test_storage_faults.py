"""Storage fault injection: full file systems and short writes, on real small tmpfs mounts.

Each test mounts its own tmpfs of a few pages to a few MB (``mount -t tmpfs -o size=...``, so the
tests need root; they are skipped otherwise), fills it with a filler file until ENOSPC, and checks
that each writer of hyperpod-lab ends in a clear error or event and loses nothing that was
committed before:

* the memory checkpoint tier (its shared-memory root ``$HYPERPOD_LAB_SHM_DIR`` on the small
  tmpfs): a slot that cannot be reserved is reported (``checkpoint.failed`` {tier: "memory",
  reason: "... no space ..."}) and training goes on; never a SIGBUS (exit 135) on a slot left
  sparse by a failed reservation, nor on a sparse slot file left by an earlier process;
* events (``events/<writer>.jsonl``): a write larger than the room left is a real short write
  (tmpfs fills the last page, then ENOSPC); the failed event is cut back, reported on stderr
  naming the file and "no space", and every complete event before and after it stays readable,
  none merged into a torn line;
* rank files: the heartbeat file (mapped: reserved before it is mapped, else SIGBUS) and the rank
  record ``ranks/rank-R.json`` (replaced atomically: the old one stays);
* persistent checkpoints: a save into a full file system fails with ``checkpoint.failed`` and an
  error naming the cause; the previous committed checkpoint still loads;
* the job store (SQLite, WAL): a write on a full file system raises ``JobStoreFull`` naming the
  database and "no space"; earlier records are intact and writes work again once there is room.

Whatever might die of a signal (SIGBUS) runs in a child process: this file is also that child's
script (``python tests/contract/test_storage_faults.py <scenario> ...``, see :func:`child_main`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.abspath(__file__)
SIGBUS_EXIT = -7  # a child killed by SIGBUS (a shell reports 135)


# ---- helpers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def small_fs(path: str, size: str):
    """A fresh tmpfs of ``size`` (mount's syntax: ``64k``, ``1m``) mounted at ``path`` (created),
    unmounted on exit."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path], check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False, capture_output=True)


def fill(directory: str, name: str = "filler") -> str:
    """Write a file into ``directory`` until its file system is full (ENOSPC); returns its path."""
    path = os.path.join(directory, name)
    chunk = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    continue
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return path
    finally:
        os.close(fd)


def free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.001"})
    env.update(extra)
    return env


def run_child(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Run a scenario of :func:`child_main` in a fresh interpreter."""
    return subprocess.run([sys.executable, SCRIPT, *args], env=_env(**env), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def read_events(job_dir: str) -> list[dict]:
    from hyperpod_lab.events import EventReader

    return [json.loads(e.to_json()) for e in EventReader(job_dir).poll()]


def _root_or_skip():
    """Fail (never skip) without root: the suite runs as root (scripts/test.sh, .ci/run)."""
    import pytest

    if os.geteuid() != 0:
        pytest.fail("mounting a small tmpfs needs root: run the suite as root (bash scripts/test.sh)")


# ---- the child's scenarios -----------------------------------------------------------------------
def child_main(argv: list[str]) -> None:
    """Scenarios that may die of a signal on a broken build, run as a child process.

    * ``tiered <steps> <floats>``: ``hp.init()`` (``$HYPERPOD_LAB_JOB_DIR``, ``$HYPERPOD_LAB_SHM_DIR``)
      and a TieredCheckpointer with a memory snapshot every step of a state of ``<floats>``
      float32s; prints ``restored <step>`` (the memory tier's newest snapshot) at the end.
    * ``sparse-slot <dir> <floats>``: a sparse ``slot-0.bin`` larger than the state is planted in
      the ring ``<dir>`` (as a failed reservation of the earlier code left it), then one snapshot.
    * ``heartbeat <path>``: a HeartbeatWriter at ``path`` and one beat.
    * ``persistent <root> <floats>``: save step 0 (committed), fill ``<root>``'s file system,
      save step 1 (must fail), free it, restore with a fresh Checkpointer: prints ``restored <step>
      <first value>``.
    """
    import torch

    what = argv[0]
    if what == "tiered":
        import hyperpod_lab.runtime as hp
        from hyperpod_lab.spec import CheckpointPolicy

        steps, floats = int(argv[1]), int(argv[2])
        with hp.init() as ctx:
            state = {"blob": {"w": torch.zeros(floats)}}
            tiered = hp.TieredCheckpointer(ctx, state, CheckpointPolicy(every_steps=10_000, keep_last=2,
                                                                        memory_every_steps=1), replicas=0)
            for step in range(steps):
                state["blob"]["w"].fill_(float(step + 1))
                ctx.step(step, loss=1.0 / (step + 1))
                tiered.maybe_save(step)
                tiered.wait()
            print(f"trained {steps} steps", flush=True)
            got = tiered.memory.restore(state)
            print(f"restored {got} {state['blob']['w'][0].item() if got is not None else None}", flush=True)
            tiered.memory.close(remove=True)
        return
    if what == "sparse-slot":
        from hyperpod_lab.runtime.checkpoint.memory import MemoryTier

        directory, floats = argv[1], int(argv[2])
        tier = MemoryTier(directory, keep_last=1)
        with open(os.path.join(directory, "slot-0.bin"), "wb") as f:
            f.truncate(floats * 4 + (1 << 20))  # sparse: no page of it allocated
        try:
            tier.snapshot(0, {"blob": {"w": torch.ones(floats)}})
            tier.wait()
            print("snapshot ok", flush=True)
        except (OSError, RuntimeError) as e:
            print(f"snapshot failed: {e}", flush=True)
            print(f"slot bytes {os.path.getsize(os.path.join(directory, 'slot-0.bin'))}", flush=True)
        return
    if what == "heartbeat":
        from hyperpod_lab.node.watchdog import HeartbeatWriter

        try:
            hb = HeartbeatWriter(argv[1], 0, 0)
            hb.step(0, 0.1, 0.1, 0.0)
            print("heartbeat ok", flush=True)
        except OSError as e:
            print(f"heartbeat failed: {e}", flush=True)
            print(f"left behind: {os.path.exists(argv[1])}", flush=True)
        return
    if what == "persistent":
        import hyperpod_lab.runtime as hp

        root, floats = argv[1], int(argv[2])
        with hp.init() as ctx:
            state = {"blob": {"w": torch.full((floats,), 7.0)}}
            ckpt = hp.Checkpointer(ctx, every_steps=1, keep_last=2, root=root)
            ckpt.save(0, state)
            ckpt.wait()
            filler = fill(os.path.dirname(root))
            state["blob"]["w"].fill_(8.0)
            try:
                ckpt.save(1, state)
                ckpt.wait()
                print("save 1 ok", flush=True)
            except Exception as e:
                print(f"save 1 failed: {type(e).__name__}: {e}", flush=True)
            os.remove(filler)
            state["blob"]["w"].fill_(0.0)
            fresh = hp.Checkpointer(ctx, every_steps=1, keep_last=2, root=root)
            nxt = fresh.restore(state)
            print(f"restored {nxt - 1} {state['blob']['w'][0].item()}", flush=True)
        return
    raise SystemExit(f"unknown scenario {what!r}")


# ---- memory tier (issue 24 #7) -------------------------------------------------------------------
def test_memory_tier_full_shm_reports_no_space_and_training_goes_on(tmp_path):
    """A state that fits one slot but not two on a 1 MiB tmpfs: the ring's second slot cannot be
    reserved. Before the fix the failed reservation left it full-size and sparse, the next
    snapshot mapped it and the rank died of SIGBUS (exit 135) on its first copy."""
    _root_or_skip()
    job_dir = str(tmp_path / "job")
    with small_fs(str(tmp_path / "shm"), "1m") as shm:
        r = run_child("tiered", "5", str(150_000), HYPERPOD_LAB_JOB_DIR=job_dir,
                      HYPERPOD_LAB_JOB_ID=f"faults-{uuid.uuid4().hex[:8]}", HYPERPOD_LAB_SHM_DIR=os.path.join(shm, "r"))
    assert r.returncode != SIGBUS_EXIT, f"the rank died of SIGBUS:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    evs = read_events(job_dir)
    failed = [e["data"] for e in evs if e["kind"] == "checkpoint.failed"]
    saved = [e["data"]["step"] for e in evs if e["kind"] == "checkpoint.saved" and e["data"]["tier"] == "memory"]
    assert failed and all(f["tier"] == "memory" and "no space" in f["reason"] for f in failed), failed
    assert saved and saved[0] == 0, saved
    assert "trained 5 steps" in r.stdout  # training went on (step events are rate-limited: not each step has one)
    assert [e["data"]["step"] for e in evs if e["kind"] == "step"][-1] >= 2
    assert evs[-1]["kind"] == "finished" and evs[-1]["data"]["status"] == "succeeded", evs[-1]
    assert evs[-1]["data"]["steps"] == 5
    # the snapshot committed before the failures is intact and restorable
    assert f"restored {saved[-1]} {float(saved[-1] + 1)}" in r.stdout, r.stdout


def test_memory_tier_first_snapshot_too_big_reports_and_goes_on(tmp_path):
    """A state larger than the whole tmpfs: every snapshot fails with "no space" (the first one
    used to leave a sparse slot that the second mapped and died on)."""
    _root_or_skip()
    job_dir = str(tmp_path / "job")
    with small_fs(str(tmp_path / "shm"), "1m") as shm:
        r = run_child("tiered", "3", str(600_000), HYPERPOD_LAB_JOB_DIR=job_dir,
                      HYPERPOD_LAB_JOB_ID=f"faults-{uuid.uuid4().hex[:8]}", HYPERPOD_LAB_SHM_DIR=os.path.join(shm, "r"))
        left = [os.path.join(d, f) for d, _, fs in os.walk(shm) for f in fs if f.endswith(".bin")]
        sizes = [os.path.getsize(p) for p in left]
    assert r.returncode != SIGBUS_EXIT, f"the rank died of SIGBUS:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    failed = [e["data"] for e in read_events(job_dir) if e["kind"] == "checkpoint.failed"]
    assert [f["step"] for f in failed] == [0, 1, 2] and all("no space" in f["reason"] for f in failed), failed
    assert "restored None" in r.stdout
    assert sizes == [] or max(sizes) == 0, f"a slot file was left sparse: {list(zip(left, sizes))}"


def test_memory_tier_sparse_slot_left_by_an_earlier_process_is_reserved_first(tmp_path):
    """A slot file that exists, big enough but sparse (a process killed between growing and
    reserving it, or the earlier code's failed reservation): the snapshot reserves it before
    copying, so a full tmpfs is an ENOSPC error (the file emptied), not a SIGBUS."""
    _root_or_skip()
    with small_fs(str(tmp_path / "shm"), "1m") as shm:
        ring = os.path.join(shm, "r", "job", "n1", "rank-0")
        r = run_child("sparse-slot", ring, str(400_000), HYPERPOD_LAB_SHM_DIR=os.path.join(shm, "r"))
    assert r.returncode != SIGBUS_EXIT, f"the snapshot died of SIGBUS:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "snapshot failed" in r.stdout and "no space" in r.stdout, r.stdout
    assert "slot bytes 0" in r.stdout, r.stdout


# ---- events (issue 24 #8) ------------------------------------------------------------------------
def _events_on_full_fs(tmp_path, raise_errors: bool, capsys):
    """``started``; fill the fs; a big ``step`` (a real short write: the event file's last page
    takes part of it, then ENOSPC), twice; a small ``checkpoint.saved`` while still full (it fits
    the file's last page once the torn part is gone); free the space; ``step``, ``finished``.
    Returns (events read, stderr, errors raised, the file)."""
    from hyperpod_lab.events import EventReader, EventWriter

    with small_fs(str(tmp_path / "fs"), "64k") as fs:
        job = os.path.join(fs, "job")
        w = EventWriter(job, "rank-0", "j1", **({} if raise_errors else {"raise_errors": False}))  # default: raise
        w.emit("started", world_size=1)
        before = open(w.path, "rb").read()
        filler = fill(fs)
        raised = []
        for _ in range(2):
            try:
                w.emit("step", step=0, loss=1.0, note="x" * 6000)
            except OSError as e:
                raised.append(e)
            assert open(w.path, "rb").read() == before  # the torn part was cut back; the first event untouched
        w.emit("checkpoint.saved", tier="memory", step=0)
        os.remove(filler)
        w.emit("step", step=1, loss=0.5)
        w.emit("finished", status="completed")
        r = EventReader(job)
        evs = r.poll()
        err = capsys.readouterr().err
        assert r.skipped == [], r.skipped
        return evs, err, raised, w.path


def test_event_short_write_on_full_fs_loses_only_that_event(tmp_path, capsys):
    """Runtime writer (never raises). Before the fix the short write was ignored, the torn line
    swallowed the next event (``finished`` vanished) and nothing was reported."""
    _root_or_skip()
    evs, err, raised, path = _events_on_full_fs(tmp_path, False, capsys)
    assert raised == []
    assert [(e.kind, e.seq) for e in evs] == [("started", 0), ("checkpoint.saved", 1), ("step", 2), ("finished", 3)]
    assert [e.data.get("step") for e in evs if e.kind == "step"] == [1]
    assert err.count("could not write") == 1, err  # one report per run of failures
    assert path in err and "no space" in err, err
    assert "2 event(s)" in err  # the end of the failures is reported too


def test_event_write_on_full_fs_raises_clear_error_for_callers_that_ask(tmp_path, capsys):
    """The default writer (the client's) raises OSError naming the file and "no space"."""
    _root_or_skip()
    evs, err, raised, path = _events_on_full_fs(tmp_path, True, capsys)
    assert len(raised) == 2 and all(e.errno == errno.ENOSPC and path in str(e) and "no space" in str(e)
                                    for e in raised), raised
    assert [e.kind for e in evs] == ["started", "checkpoint.saved", "step", "finished"]


class _NoCutBackFiles:
    """A FileAccess over local files whose append cannot be undone (one ``write()``, as over SFTP,
    where a partial append stays): the writer must end the torn line itself."""

    def __init__(self):
        from hyperpod_lab.events import LocalFiles

        self._local = LocalFiles()

    def __getattr__(self, name):
        return getattr(self._local, name)

    def append_bytes(self, path, data):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            n = os.write(fd, data)
            if n < len(data):
                raise OSError(errno.ENOSPC, "No space left on device (short write)", path)
        finally:
            os.close(fd)


def test_event_torn_line_that_stays_is_ended_before_the_next_event(tmp_path, capsys):
    _root_or_skip()
    from hyperpod_lab.events import EventReader, EventWriter

    with small_fs(str(tmp_path / "fs"), "64k") as fs:
        job = os.path.join(fs, "job")
        w = EventWriter(job, "client", "j1", files=_NoCutBackFiles(), raise_errors=False)
        w.emit("submitted", cluster="c")
        filler = fill(fs)
        w.emit("step", step=0, note="y" * 6000)  # torn: part of it stays in the file
        os.remove(filler)
        w.emit("finished", status="completed")
        r = EventReader(job)
        evs = r.poll()
    assert [(e.kind, e.seq) for e in evs] == [("submitted", 0), ("finished", 2)]  # seq 1: the torn line
    assert len(r.skipped) == 1  # the torn line, skipped as malformed, not merged with 'finished'
    assert "no space" in capsys.readouterr().err


# ---- rank files ----------------------------------------------------------------------------------
def test_heartbeat_in_full_shm_is_an_error_not_sigbus(tmp_path):
    """The rank's heartbeat file is mapped; on a full /dev/shm it used to be grown sparse and the
    first store into it killed the rank with SIGBUS."""
    _root_or_skip()
    with small_fs(str(tmp_path / "shm"), "64k") as shm:
        fill(shm)
        r = run_child("heartbeat", os.path.join(shm, "local-0.hb"))
    assert r.returncode != SIGBUS_EXIT, f"the rank died of SIGBUS:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "heartbeat failed" in r.stdout and "no space" in r.stdout and "left behind: False" in r.stdout, r.stdout


def test_rank_file_on_full_fs_keeps_the_previous_one(tmp_path):
    """``ranks/rank-R.json`` is replaced atomically: on a full file system the write fails with
    ENOSPC naming the file, the previous record stays whole and no temporary file is left."""
    _root_or_skip()
    from hyperpod_lab.atomicfile import write_json_atomic
    from hyperpod_lab.jobdir import JobPaths

    with small_fs(str(tmp_path / "fs"), "64k") as fs:
        paths = JobPaths(os.path.join(fs, "job"), join=os.path.join)
        os.makedirs(paths.ranks)
        write_json_atomic(paths.rank_file(0), {"rank": 0, "pid": 1})
        fill(fs)
        try:
            write_json_atomic(paths.rank_file(0), {"rank": 0, "pid": 2, "pad": "z" * 20000})
            raise AssertionError("the write into a full file system succeeded")
        except OSError as e:
            assert e.errno == errno.ENOSPC and paths.ranks in str(e), e
        with open(paths.rank_file(0)) as f:
            assert json.load(f) == {"rank": 0, "pid": 1}
        assert os.listdir(paths.ranks) == ["rank-0.json"]


# ---- persistent checkpoints ----------------------------------------------------------------------
def test_persistent_save_into_full_fs_fails_clearly_and_previous_checkpoint_loads(tmp_path):
    _root_or_skip()
    job_dir = str(tmp_path / "job")
    with small_fs(str(tmp_path / "ckpt"), "4m") as fs:
        r = run_child("persistent", os.path.join(fs, "checkpoints"), str(200_000), HYPERPOD_LAB_JOB_DIR=job_dir,
                      HYPERPOD_LAB_JOB_ID=f"faults-{uuid.uuid4().hex[:8]}")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "save 1 failed" in r.stdout and "No space left on device" in r.stdout, r.stdout
    assert "restored 0 7.0" in r.stdout, r.stdout
    evs = read_events(job_dir)
    failed = [e["data"] for e in evs if e["kind"] == "checkpoint.failed"]
    assert [(f["tier"], f["step"]) for f in failed] == [("persistent", 1)], failed
    assert "No space left on device" in failed[0]["reason"], failed
    restored = [e["data"] for e in evs if e["kind"] == "checkpoint.restored"]
    assert [(x["tier"], x["step"]) for x in restored] == [("persistent", 0)], restored


# ---- the job store -------------------------------------------------------------------------------
def test_job_store_on_full_fs_raises_clear_error_and_keeps_records(tmp_path):
    _root_or_skip()
    from hyperpod_lab.submit.jobs import JobRecord, JobStatus, JobStore, JobStoreFull

    def rec(i: int, pad: int = 10) -> JobRecord:
        return JobRecord(job_id=f"job-{i}", name="n", cluster="c", orchestrator="local", native_id=str(i),
                         job_dir=f"/x/{i}", spec={"pad": "p" * pad})

    with small_fs(str(tmp_path / "fs"), "256k") as fs:
        store = JobStore(os.path.join(fs, "jobs"))
        for i in range(3):
            store.put(rec(i))
        filler = fill(fs)
        errors = []
        for op in (lambda: store.put(rec(9, pad=200_000)),
                   lambda: store.add(rec(10, pad=200_000)),
                   lambda: store.update_status(store.get("job-1"), JobStatus.RUNNING, reason="r" * 200_000)):
            try:
                op()
            except JobStoreFull as e:
                errors.append(e)
        assert len(errors) == 3, errors
        assert all(store.path in str(e) and "no space" in str(e) and e.errno == errno.ENOSPC for e in errors), errors
        assert sorted(r.job_id for r in JobStore(store.root).list()) == ["job-0", "job-1", "job-2"]
        assert store.get("job-1").status == "pending"
        os.remove(filler)
        store.put(rec(9))  # room again: writes work
        assert len(store.list()) == 4


if __name__ == "__main__":
    child_main(sys.argv[1:])
