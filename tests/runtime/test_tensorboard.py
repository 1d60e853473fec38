"""TensorBoard event files from the runtime (JobSpec ``tensorboard``, ``submit --tensorboard``):
real jobs (2 gloo ranks, DDP, DCP checkpoints) write them with torch's SummaryWriter, and
TensorBoard's own ``EventAccumulator`` reads back exactly the losses of the job's step events;
on the Slurm dev cluster the files land on the shared storage. Plus the spec/CLI checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.spec import JobSpec

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:  # a hard dependency: fail with the fix, never skip
    pytest.fail("tensorboard is not installed; pip install tensorboard (or pip install -e .)", pytrace=False)

STEPS = 12
SCRIPT = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                           "metrics_train.py")).read()  # STEPS steps: METRICS_TEST_STEPS unset
EVERY_STEP = {"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.000001"}  # a step event for every step, to compare


def scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(s.step, s.value) for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def step_losses(client, job_id: str) -> list[tuple[int, float]]:
    return [(e.data["step"], e.data["loss"]) for e in client.event_reader(job_id).poll() if e.kind == "step"]


def assert_same_losses(tb: list[tuple[int, float]], events: list[tuple[int, float]]) -> None:
    # TensorBoard stores scalars as float32
    assert [s for s, _ in tb] == [s for s, _ in events] == list(range(STEPS)), (tb, events)
    assert [v for _, v in tb] == [float(np.float32(v)) for _, v in events]


def test_local_job_writes_the_step_losses_for_tensorboard(client, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    job_id = cli.run(["submit", str(tmp_path / "train.py"), "--cluster", "local", "--nodes", "1",
                      "--procs-per-node", "2", "--tensorboard", "--env",
                      f"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S={EVERY_STEP['HYPERPOD_LAB_STEP_EVENT_INTERVAL_S']}"],
                     client=client)
    rec = client.wait(job_id, timeout_s=180)
    assert rec.exit_code == 0, client.logs(job_id)[-3000:]
    assert rec.spec["tensorboard"] == "rank0"
    logdir = os.path.join(rec.job_dir, "tensorboard")
    files = sorted(os.listdir(logdir))
    assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files  # rank 0 only, no rank-N dirs
    got = scalars(logdir)
    assert_same_losses(got["loss"], step_losses(client, job_id))
    assert [s for s, _ in got["steps_per_s"]] == list(range(STEPS)) and all(v > 0 for _, v in got["steps_per_s"])
    assert got["lr"] == [(s, pytest.approx(0.05)) for s in range(STEPS)] and len(got["batch"]) == STEPS
    assert "note" not in got  # not a number: not a scalar
    saved = sorted({e.data["step"] for e in client.event_reader(job_id).poll()
                    if e.kind == "checkpoint.saved" and e.data.get("tier") == "persistent" and e.writer == "rank-0"})
    assert saved == [3, 7, 11] and got["checkpoint/persistent"] == [(s, float(s)) for s in saved]


def test_slurm_job_writes_them_on_the_shared_storage_per_rank(dev_cluster, client, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    spec = JobSpec(script=str(tmp_path / "train.py"), name="tb", cluster="local-slurm", nodes=2, procs_per_node=1,
                   env=dict(EVERY_STEP), tensorboard="all-ranks").validate()
    rec = client.submit(spec)
    rec = client.wait(rec.job_id, timeout_s=240)
    assert rec.exit_code == 0, client.logs(rec.job_id)[-3000:]
    root = os.path.join(rec.job_dir, "tensorboard")
    assert sorted(os.listdir(root)) == ["rank-0", "rank-1"]
    assert_same_losses(scalars(os.path.join(root, "rank-0"))["loss"], step_losses(client, rec.job_id))
    rank1 = scalars(os.path.join(root, "rank-1"))["loss"]  # rank 1's own batches: its own losses
    assert [s for s, _ in rank1] == list(range(STEPS)) and rank1 != scalars(os.path.join(root, "rank-0"))["loss"]


def test_spec_field_and_flag():
    assert JobSpec(script="t.py").validate().tensorboard == "off"
    assert JobSpec(script="t.py", tensorboard=True).validate().tensorboard == "rank0"
    assert JobSpec.from_dict({"script": "t.py", "tensorboard": False}).tensorboard == "off"
    assert JobSpec.from_dict({"script": "t.py", "tensorboard": "all-ranks"}).to_dict()["tensorboard"] == "all-ranks"
    with pytest.raises(SpecError, match=r"tensorboard: must be one of off, rank0, all-ranks .*--tensorboard"):
        JobSpec(script="t.py", tensorboard="yes please").validate()
    parse = cli.build_parser().parse_args
    assert parse(["submit", "t.py"]).tensorboard == "off"
    assert parse(["submit", "--tensorboard", "t.py"]).tensorboard == "rank0"
    assert parse(["submit", "t.py", "--tensorboard-all-ranks"]).tensorboard == "all-ranks"


def test_missing_tensorboard_package_is_a_clear_error(tmp_path):
    """In a Python where ``import tensorboard`` fails (``sys.modules["tensorboard"] = None``, as
    if it were not installed): the spec check at submit and the runtime's writer both name
    ``pip install tensorboard``."""
    code = """
import sys
sys.modules["tensorboard"] = None
from hyperpod_lab.errors import SpecError
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.runtime.tensorboard import TensorBoardLog, TensorBoardMissing
try:
    JobSpec(script="t.py", tensorboard=True).validate()
except SpecError as e:
    print("SPEC", e)
try:
    TensorBoardLog(sys.argv[1])
except TensorBoardMissing as e:
    print("RUNTIME", e)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tb")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("SPEC tensorboard: needs the tensorboard package") and "pip install tensorboard" in lines[0]
    assert lines[1].startswith("RUNTIME ") and "pip install tensorboard" in lines[1], lines


def test_a_restarted_job_has_each_step_once_in_tensorboard(client, tmp_path):
    """Rank 1 is SIGKILLed once step 4 is reported (after the checkpoint of step 3, before the
    one of step 7); both ranks restart from step 3's and redo steps 4.. . Rank 0's new process opens a second event file with purge_step 4, so TensorBoard
    shows each step once, with the loss of its last step event (the recomputed one)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    job_id = cli.run(["submit", str(tmp_path / "train.py"), "--cluster", "local", "--nodes", "1",
                      "--procs-per-node", "2", "--tensorboard", "--env", "METRICS_TEST_STEP_SLEEP=0.6", "--env",
                      f"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S={EVERY_STEP['HYPERPOD_LAB_STEP_EVENT_INTERVAL_S']}"],
                     client=client)
    reader, deadline = client.event_reader(job_id), time.monotonic() + 120
    while not any(e.kind == "step" and e.data["step"] >= 4 for e in reader.poll()):
        assert time.monotonic() < deadline, client.logs(job_id)[-3000:]
        time.sleep(0.1)
    cli.run(["inject-fault", job_id, "--rank", "1"], client=client)
    rec = client.wait(job_id, timeout_s=240)
    assert rec.exit_code == 0, client.logs(job_id)[-3000:]
    events = client.event_reader(job_id).poll()
    done = next(e for e in events if e.kind == "recovery.completed")
    assert done.data["restored_step"] == 3, done.data
    steps = [(e.data["step"], e.data["loss"]) for e in events if e.kind == "step"]
    assert len(steps) > STEPS  # some steps were done twice
    last = dict(steps)  # the newest loss of each step
    logdir = os.path.join(rec.job_dir, "tensorboard")
    assert len(os.listdir(logdir)) == 2  # one event file per incarnation of rank 0
    got = scalars(logdir)
    assert_same_losses(got["loss"], sorted(last.items()))
    assert got["recovery/downtime_s"] == [(4, pytest.approx(done.data["downtime_s"], rel=1e-6))]
    assert [s for s, _ in got["checkpoint/persistent"]] == [3, 7, 11]
