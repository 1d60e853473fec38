"""Pre-flight node health checks (``hyperpod_lab.node.health``), with real parts only.

The CLI runs as a real subprocess against a temporary job directory; the failures are real: a
1 MiB tmpfs as the memory tier's root, a read-only bind mount of the job's ``health`` directory,
no ``nvidia-smi`` on PATH, a version the node does not run. The mounts need root (the tests
fail, never skip, without it) and are always unmounted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from hyperpod_lab._version import __version__
from hyperpod_lab.events import EventReader, EventWriter
from hyperpod_lab.jobdir import ENV_JOB_DIR, ENV_JOB_ID, ENV_SHM_DIR, ENV_SPEC
from hyperpod_lab.node import health
from hyperpod_lab.node.health import (
    ENV_HEALTH_MAX_CLOCK_SKEW_S,
    ENV_HEALTH_MIN_SHM_BYTES,
    NodeHealth,
    check_node,
    load_results,
    measured_shm_bytes,
    summarize,
)

MiB = 2**20
NODE = "n7"
JOB = "health-test-job"


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("these tests mount a tmpfs and a read-only bind mount: run them as root", pytrace=False)


def _umount(path: str) -> None:
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], check=True)


@pytest.fixture
def job_dir(tmp_path):
    """A job directory whose spec has the memory tier on (every 5 steps)."""
    d = tmp_path / "job"
    d.mkdir()
    _write_spec(str(d), memory_every_steps=5)
    return str(d)


def _write_spec(job_dir: str, *, memory_every_steps=None, recovery="restart") -> None:
    spec = {"script": "train.py", "checkpoint": {"memory_every_steps": memory_every_steps},
            "resiliency": {"recovery": recovery}}
    with open(os.path.join(job_dir, "spec.json"), "w") as f:
        json.dump(spec, f)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB tmpfs, unmounted after the test."""
    _need_root()
    mnt = tmp_path / "tiny-shm"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield str(mnt)
    finally:
        _umount(str(mnt))


@pytest.fixture
def roomy_shm(tmp_path):
    """A memory-tier root on the test's own file system (plenty of room)."""
    d = tmp_path / "shm"
    d.mkdir(mode=0o700)
    return str(d)


def _env(job_dir: str, shm_root: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPOD_LAB_HEALTH_")}
    env.pop(ENV_SPEC, None)
    env.update({ENV_JOB_DIR: job_dir, ENV_JOB_ID: JOB, ENV_SHM_DIR: shm_root, "SLURMD_NODENAME": NODE})
    env.update(extra)
    return env


def _run(job_dir: str, shm_root: str, *args: str, env: dict[str, str] | None = None,
         run_id: str = "run-1") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hyperpod_lab.node.health", "--node-run-id", run_id, *args],
                          env=env or _env(job_dir, shm_root), capture_output=True, text=True, timeout=120)


def _events(job_dir: str) -> list:
    return [ev for ev in EventReader(job_dir).poll() if ev.kind.startswith("health.")]


def _checked(job_dir: str) -> dict:
    evs = [ev for ev in _events(job_dir) if ev.kind == "health.checked"]
    assert len(evs) == 1, evs
    assert evs[0].writer == f"health-{NODE}"
    return evs[0].data


def _failed_events(job_dir: str) -> list[dict]:
    return [ev.data for ev in _events(job_dir) if ev.kind == "health.failed"]


# ---- the CLI, healthy ------------------------------------------------------------------------
def test_healthy_node_exits_0_with_every_check_recorded(job_dir, roomy_shm):
    t0 = time.monotonic()
    proc = _run(job_dir, roomy_shm)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = _checked(job_dir)
    assert data["ok"] is True and data["node"] == NODE and data["run_id"] == "run-1"
    checks = data["checks"]
    assert list(checks) == sorted(health.CHECKS)  # JSON keys: every check present
    for name in ("shm", "storage", "clock"):
        assert checks[name]["status"] == "passed", checks[name]
    assert checks["gpu"]["status"] == "skipped" and checks["gpu"]["detail"] == "no GPU requested"
    # versions: nothing expected -> skipped, and the versions found are still reported
    assert checks["versions"]["status"] == "skipped"
    assert checks["versions"]["versions"]["hyperpod_lab"] == __version__
    import torch

    assert checks["versions"]["versions"]["torch"] == torch.__version__
    assert checks["shm"]["needed_bytes"] == 64 * MiB and checks["shm"]["free_bytes"] >= 64 * MiB
    assert checks["storage"]["write_s"] > 0 and abs(checks["clock"]["skew_s"]) < 2.0
    assert all(c["seconds"] >= 0 for c in checks.values())
    assert _failed_events(job_dir) == []
    # one line per check on stdout, prefixed, then the verdict
    lines = proc.stdout.strip().splitlines()
    assert [ln.split(":")[2].split()[0] for ln in lines[:5]] == list(health.CHECKS)
    assert all(ln.startswith(f"hyperpod-lab: health {NODE}: ") for ln in lines)
    assert "ok (0 of 5 checks failed)" in lines[-1]
    # the result file is the NodeHealth, and the probe is gone
    [loaded] = load_results(job_dir, "run-1")
    assert loaded.node == NODE and loaded.ok and loaded.run_id == "run-1"
    assert loaded.checks["storage"].extra["bytes"] == 1 * MiB
    assert os.listdir(os.path.join(job_dir, "health", NODE)) == []
    # the checks themselves are quick but for versions, which asks a child interpreter for torch's
    # version and devices (torch's import time: the health process itself never imports torch)
    assert data["seconds"] - checks["versions"]["seconds"] < 1.0, data
    assert checks["versions"]["seconds"] < 30.0, checks["versions"]
    print(f"health CLI wall time {wall:.2f} s, checks {data['seconds']:.3f} s")


# ---- shm -------------------------------------------------------------------------------------
def test_tiny_tmpfs_fails_shm_with_node_free_and_needed_bytes(job_dir, tiny_tmpfs):
    proc = _run(job_dir, tiny_tmpfs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = _checked(job_dir)
    assert data["ok"] is False
    shm = data["checks"]["shm"]
    assert shm["status"] == "failed"
    assert (shm["free_bytes"], shm["needed_bytes"]) == (1 * MiB, 64 * MiB)
    assert shm["path"] == tiny_tmpfs  # the nearest existing ancestor of <root>/<job>/<node>: not created
    assert not os.path.exists(os.path.join(tiny_tmpfs, JOB))
    for text in (f"node {NODE}", "1.0 MiB (1048576 bytes) free", "needs 64.0 MiB (67108864 bytes)", tiny_tmpfs):
        assert text in shm["detail"], shm["detail"]
    assert data["checks"]["storage"]["status"] == "passed"  # only shm failed
    assert _failed_events(job_dir) == [{"node": NODE, "run_id": "run-1", "check": "shm", "detail": shm["detail"]}]
    assert f"hyperpod-lab: health {NODE}: shm failed" in proc.stdout


def test_shm_budget_floor_and_explicit_budget_on_the_tiny_tmpfs(job_dir, tiny_tmpfs):
    # the floor comes from the environment: 512 KiB fits in 1 MiB
    proc = _run(job_dir, tiny_tmpfs, env=_env(job_dir, tiny_tmpfs, **{ENV_HEALTH_MIN_SHM_BYTES: str(512 * 1024)}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shm = _checked(job_dir)["checks"]["shm"]
    assert shm["status"] == "passed" and shm["needed_bytes"] == 512 * 1024
    # --shm-bytes is the budget itself, no floor
    shutil.rmtree(os.path.join(job_dir, "events"))
    proc = _run(job_dir, tiny_tmpfs, "--shm-bytes", str(2 * MiB))
    assert proc.returncode == 1
    shm = _checked(job_dir)["checks"]["shm"]
    assert shm["status"] == "failed" and shm["needed_bytes"] == 2 * MiB and shm["budget_from"] == "--shm-bytes"


def test_shm_budget_is_measured_from_the_jobs_memory_checkpoints(job_dir, tiny_tmpfs):
    """Per (node, step) the ranks' memory_bytes add up; a rank counted once; the max wins."""
    def saved(rank, node, step, mb, tier="memory"):
        EventWriter(job_dir, f"rank-{rank}", JOB).emit("checkpoint.saved", tier=tier, step=step, bytes=1, rank=rank,
                                                       node=node, memory_bytes=mb * MiB)

    saved(0, "n1", 5, 10), saved(1, "n1", 5, 12)
    saved(0, "n1", 10, 40), saved(1, "n1", 10, 50), saved(0, "n1", 10, 40)  # rank 0 again after a restart
    saved(2, "n2", 5, 30)
    saved(3, "n2", 5, 500, tier="persistent")  # not the memory tier
    assert measured_shm_bytes(job_dir) == (90 * MiB, 6)
    h = check_node(job_dir, JOB, NODE, shm_root=tiny_tmpfs, max_clock_skew_s=2.0)
    shm = h.checks["shm"]
    assert shm.status == "failed" and shm.extra["needed_bytes"] == 90 * MiB and shm.extra["budget_from"] == "events"
    assert f"90.0 MiB ({90 * MiB} bytes)" in shm.detail


def test_shm_budget_reads_the_newest_memory_checkpoints_of_each_rank_not_the_history(job_dir):
    """Every node's check runs at each start of the job: it reads SHM_TAIL_BYTES of each rank's
    file (issue 27: not the job's whole history), so a footprint from long ago is not counted."""
    from hyperpod_lab.events import LocalFiles
    from hyperpod_lab.node.health import SHM_TAIL_BYTES

    w = [EventWriter(job_dir, f"rank-{r}", JOB) for r in range(2)]
    for r in range(2):
        w[r].emit("checkpoint.saved", tier="memory", step=0, bytes=1, rank=r, node="n1", memory_bytes=900 * MiB)
    for step in range(1, 400):
        for r in range(2):
            w[r].emit("checkpoint.saved", tier="memory", step=step, bytes=1, rank=r, node="n1", memory_bytes=10 * MiB)
    total = sum(os.path.getsize(os.path.join(job_dir, "events", f"rank-{r}.jsonl")) for r in range(2))
    before = LocalFiles.bytes_read
    measured, n = measured_shm_bytes(job_dir)
    read = LocalFiles.bytes_read - before
    assert measured == 20 * MiB and 0 < n < 400, (measured, n)
    assert read <= 2 * SHM_TAIL_BYTES < total / 3, (read, total)


def test_shm_skipped_without_a_memory_tier_even_on_the_tiny_tmpfs(job_dir, tiny_tmpfs):
    _write_spec(job_dir, memory_every_steps=None, recovery="restart")
    h = check_node(job_dir, JOB, NODE, shm_root=tiny_tmpfs)
    assert h.checks["shm"].status == "skipped" and "no memory tier" in h.checks["shm"].detail
    assert h.ok
    # checkpointless recovery keeps snapshots in memory: checked (and failed) again
    _write_spec(job_dir, memory_every_steps=None, recovery="checkpointless")
    h = check_node(job_dir, JOB, NODE, shm_root=tiny_tmpfs)
    assert h.checks["shm"].status == "failed" and not h.ok


# ---- storage and clock -----------------------------------------------------------------------
def test_read_only_health_dir_fails_storage_with_erofs_and_skips_clock(job_dir, roomy_shm):
    _need_root()
    hdir = os.path.join(job_dir, "health")
    os.mkdir(hdir)
    subprocess.run(["mount", "--bind", hdir, hdir], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", hdir], check=True)
        proc = _run(job_dir, roomy_shm)
    finally:
        _umount(hdir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = _checked(job_dir)
    assert data["ok"] is False
    storage, clock = data["checks"]["storage"], data["checks"]["clock"]
    assert storage["status"] == "failed" and storage["errno"] == "EROFS"
    assert "EROFS" in storage["detail"] and os.path.join(hdir, NODE) in storage["detail"]
    assert f"node {NODE}" in storage["detail"] and "read-only" in storage["detail"]
    assert clock["status"] == "skipped" and "storage check failed" in clock["detail"]
    assert [e["check"] for e in _failed_events(job_dir)] == ["storage"]
    # the result file could not be written either: said on stderr
    assert "could not write" in proc.stderr and "EROFS" in proc.stderr


def test_clock_skew_over_the_limit_fails(job_dir, roomy_shm):
    """A limit of 0 s: the real skew of a local file system (a few ms, mtime is coarse) is over it."""
    proc = _run(job_dir, roomy_shm, env=_env(job_dir, roomy_shm, **{ENV_HEALTH_MAX_CLOCK_SKEW_S: "0"}))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    clock = _checked(job_dir)["checks"]["clock"]
    assert clock["status"] == "failed" and clock["max_skew_s"] == 0.0 and clock["skew_s"] != 0
    assert f"node {NODE}" in clock["detail"] and "time sync" in clock["detail"]


# ---- gpu -------------------------------------------------------------------------------------
def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "nvidia-smi")))


def test_gpu_skipped_when_none_requested_never_passed(job_dir, roomy_shm):
    h = check_node(job_dir, JOB, NODE, expect_gpus=0, shm_root=roomy_shm)
    assert h.checks["gpu"].status == "skipped" and h.checks["gpu"].detail == "no GPU requested"


def test_gpu_expected_without_nvidia_smi_fails(job_dir, roomy_shm):
    env = _env(job_dir, roomy_shm, PATH=_path_without_nvidia_smi())
    proc = _run(job_dir, roomy_shm, "--expect-gpus", "1", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    gpu = _checked(job_dir)["checks"]["gpu"]
    assert gpu["status"] == "failed" and "nvidia-smi" in gpu["detail"] and f"node {NODE}" in gpu["detail"]
    assert "needs 1 GPU(s)" in gpu["detail"]
    assert [e["check"] for e in _failed_events(job_dir)] == ["gpu"]


# ---- versions --------------------------------------------------------------------------------
def test_wrong_versions_fail_naming_both(job_dir, roomy_shm):
    import torch

    proc = _run(job_dir, roomy_shm, "--expect-version", "9.9.9", "--expect-torch", "1.0.0\nrc1")
    assert proc.returncode == 1
    v = _checked(job_dir)["checks"]["versions"]
    assert v["status"] == "failed"
    for text in (__version__, "9.9.9", torch.__version__, "1.0.0 rc1", f"node {NODE}"):
        assert text in v["detail"], v["detail"]
    # a detail is one line: the supervisor reads the failed checks from srun's output
    lines = proc.stdout.splitlines()
    assert len(lines) == 6 and all(ln.startswith(f"hyperpod-lab: health {NODE}: ") for ln in lines)
    assert f"hyperpod-lab: health {NODE}: versions failed (" in proc.stdout
    h = check_node(job_dir, JOB, NODE, shm_root=roomy_shm, expect_version=__version__,
                   expect_torch=torch.__version__)
    assert h.checks["versions"].status == "passed" and h.ok


# ---- across nodes ----------------------------------------------------------------------------
def _with_torch(h: NodeHealth, node: str, version: str) -> NodeHealth:
    d = h.to_dict()
    d["node"] = node
    d["checks"]["versions"]["versions"]["torch"] = version
    return NodeHealth.from_dict(d)


def test_summarize_flags_the_node_whose_torch_differs(job_dir, roomy_shm):
    real = check_node(job_dir, JOB, "n1", shm_root=roomy_shm)
    assert real.ok
    mine = real.checks["versions"].extra["versions"]["torch"]
    nodes = [_with_torch(real, "n1", mine), _with_torch(real, "n2", "2.0.0"), _with_torch(real, "n3", mine)]
    out = summarize(nodes)
    assert list(out) == ["n2"]
    [(check, detail)] = out["n2"]
    assert check == "versions" and "2.0.0" in detail and mine in detail and "2 of 3" in detail
    # two nodes, two versions: no majority, both are flagged
    out = summarize(nodes[:2])
    assert sorted(out) == ["n1", "n2"] and all(c == "versions" for c, _ in out["n1"] + out["n2"])
    assert summarize([nodes[0], nodes[2]]) == {}


def test_load_results_and_summarize_after_real_runs(job_dir, roomy_shm, tiny_tmpfs):
    assert _run(job_dir, roomy_shm, run_id="r2").returncode == 0
    env = _env(job_dir, tiny_tmpfs, SLURMD_NODENAME="n8")
    assert _run(job_dir, tiny_tmpfs, env=env, run_id="r2").returncode == 1
    with open(os.path.join(job_dir, "health", "r2", "n9.json"), "w") as f:
        f.write("{not json")
    results = load_results(job_dir, "r2")
    assert [h.node for h in results] == [NODE, "n8", "n9"]
    out = summarize(results)
    assert sorted(out) == ["n8", "n9"]
    assert [c for c, _ in out["n8"]] == ["shm"] and "node n8" in out["n8"][0][1]
    assert out["n9"][0][0] == "report" and "n9.json" in out["n9"][0][1]
    assert load_results(job_dir, "no-such-run") == []
    with pytest.raises(ValueError):
        load_results(job_dir, "../escape")


def test_usage_errors_exit_2(job_dir, roomy_shm):
    env = _env(job_dir, roomy_shm)
    del env[ENV_JOB_DIR]
    proc = _run(job_dir, roomy_shm, env=env)
    assert proc.returncode == 2 and ENV_JOB_DIR in proc.stderr
    proc = _run(job_dir, roomy_shm, run_id="../x")
    assert proc.returncode == 2 and "--node-run-id" in proc.stderr
    assert not os.path.exists(os.path.join(job_dir, "events"))
