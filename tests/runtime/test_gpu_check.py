"""benchmarks/gpu_check.py on a machine without a GPU (issue 25 #4).

The script's GPU branches cannot run here; what can: it imports without a GPU, its default run
says "no GPU" and exits 3 with ``{"gpu": null, "ran": false, ...}``, and ``--dry-run-on-cpu`` runs
the same five check functions on CPU tensors (real memory tier in a tmpfs-like directory, real
torchft Lighthouse and Manager, real DCP, the real health check reading a FAKE ``nvidia-smi``,
the one fake, a shell script the script itself writes) each in its own process, so that every
code path but the CUDA calls runs. A check that fails records its error and the others still
run (a real failure: a shared-memory root that is not private, which the memory tier refuses),
and a check that hangs past its limit is killed and recorded.

Each run gets ``CUDA_VISIBLE_DEVICES=""`` so the test means the same on a machine with a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


def _run(args: list[str], timeout: float = 150) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_imports_without_a_gpu_and_names_its_checks():
    from benchmarks import gpu_check

    assert gpu_check.CHECKS == ("memory_tier_stall", "memory_tier_overlap", "checkpointless_step", "dcp_cuda",
                                "health_nvidia_smi")
    assert set(gpu_check.CHECK_FUNCS) == set(gpu_check.CHECKS)
    assert (gpu_check.EXIT_OK, gpu_check.EXIT_FAILED, gpu_check.EXIT_USAGE, gpu_check.EXIT_NO_GPU) == (0, 1, 2, 3)


def test_without_cuda_it_says_no_gpu_and_exits_3(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = _run(["--out", str(out)], timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no GPU: torch.cuda.is_available() is False on this machine; run it on a GPU machine" in r.stdout
    got = json.loads(out.read_text())
    assert got["gpu"] is None and got["ran"] is False
    assert got["reason"].startswith("no GPU: torch.cuda.is_available() is False")
    assert got["exit_status"] == 3 and "checks" not in got


def test_cpu_dry_run_runs_every_check(tmp_path):
    out, shm = tmp_path / "dry.json", tmp_path / "shm"
    r = _run(["--dry-run-on-cpu", "--out", str(out), "--shm-dir", str(shm)])
    got = json.loads(out.read_text())
    checks = got["checks"]
    assert r.returncode == 0, r.stdout + r.stderr + json.dumps({k: v.get("error") for k, v in checks.items()})
    assert got["ran"] is True and got["mode"] == "cpu-dry-run" and got["device"] == "cpu" and got["gpu"] is None
    assert list(checks) == list(got["passed"]) == ["memory_tier_stall", "memory_tier_overlap", "checkpointless_step",
                                                  "dcp_cuda", "health_nvidia_smi"]
    assert got["failed"] == [] and got["exit_status"] == 0
    for name, c in checks.items():
        assert c["ok"] is True and "error" not in c and c["seconds"] > 0, (name, c)
    for line in ("ok     memory_tier_stall", "ok     health_nvidia_smi", "5/5 checks passed"):
        assert line in r.stdout, r.stdout

    stall = checks["memory_tier_stall"]  # numbers against the baseline measured in the same run
    assert stall["state_device"] == "cpu" and stall["state_bytes"] == 8 << 20
    assert stall["memcpy"]["seconds"] > 0 and stall["memcpy"]["pinned"] is False and stall["slot_pinned"] is False
    assert stall["snapshot"]["copy_s"] > 0 and stall["snapshot"]["commit_s"] >= stall["snapshot"]["blocked_s"] > 0
    assert stall["snapshot_copy_x_memcpy"] == stall["snapshot"]["copy_s"] / stall["memcpy"]["seconds"]
    assert set(stall["loop"]["added_s_per_checkpoint"]) == {"memcpy", "memory_tier"}
    assert stall["restored_equal"] is True

    overlap = checks["memory_tier_overlap"]
    assert set(overlap["loop"]["added_s_per_checkpoint"]) == {"memcpy", "memory_tier", "memory_tier_overlap"}
    assert 0 < overlap["deferrable_bytes"] <= overlap["state_bytes"]
    assert len(overlap["snapshots_checked"]) == 2 and overlap["snapshots_equal"] is True

    ft = checks["checkpointless_step"]
    assert ft["ctx_device"] == "cpu" and ft["committed_steps"] == 2 and ft["params_device"] == ["cpu"]
    assert ft["params_changed"] is True and len(ft["losses"]) == 2

    dcp = checks["dcp_cuda"]
    assert dcp["memcpy_s"] > 0 and len(dcp["async_save"]) == 2 and dcp["sync_save_s"] > 0
    assert dcp["restore_next_step"] == 2 and dcp["restored_equal"] is True and dcp["changed_before_restore"] is True

    health = checks["health_nvidia_smi"]
    assert health["nvidia_smi"].startswith("FAKE") and health["parsed_as_expected"] is True
    assert health["gpu_check"]["visible"] == 1 and health["gpu_check"]["torch_devices"] == 0
    assert health["gpu_check"]["gpus"][0]["retired_pages.pending"] is None  # "[N/A]" read as unknown

    assert not os.listdir(shm), "the memory tier's slots were left behind"


def test_a_failing_check_is_recorded_and_the_others_still_run(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o777)  # not private: the memory tier refuses it (a real failure, not a mock)
    out = tmp_path / "dry.json"
    r = _run(["--dry-run-on-cpu", "--out", str(out), "--shm-dir", str(shm),
              "--checks", "memory_tier_stall", "health_nvidia_smi"])
    assert r.returncode == 1, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert got["failed"] == ["memory_tier_stall"] and got["passed"] == ["health_nvidia_smi"]
    stall = got["checks"]["memory_tier_stall"]
    assert stall["ok"] is False and "PrivateDirError" in stall["error"] and str(shm) in stall["error"]
    assert stall["memcpy"]["seconds"] > 0  # what was measured before the failure is kept
    assert "FAILED memory_tier_stall" in r.stdout and "error: PrivateDirError" in r.stdout
    assert got["checks"]["health_nvidia_smi"]["ok"] is True


def test_a_check_past_its_limit_is_killed_and_recorded(tmp_path):
    out = tmp_path / "dry.json"
    r = _run(["--dry-run-on-cpu", "--out", str(out), "--shm-dir", str(tmp_path / "shm"),
              "--checks", "checkpointless_step", "--check-timeout-s", "1"], timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert got["failed"] == ["checkpointless_step"]
    assert got["checks"]["checkpointless_step"]["error"].startswith("timed out after 1 s")
