"""MLflow tracking from the runtime (JobSpec ``tracking: "mlflow"``, ``submit --tracking mlflow``),
against a real MLflow tracking server (``mlflow server`` with a SQLite backend store on loopback,
one per module) and read back with ``mlflow.MlflowClient``: a local job's params, loss curve,
checkpoint markers, goodput and final state; on the Slurm dev cluster a job whose rank is killed
with ``inject-fault`` logs its restart into the same run (exactly one run for the job); a down
server neither stops nor slows a job; a slow one never blocks the caller. Plus the spec and CLI
checks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from ports import free_port

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.events import Event
from hyperpod_lab.runtime import mlflow_tracking
from hyperpod_lab.spec import JobSpec

try:
    from mlflow import MlflowClient
except ImportError:  # a hard dependency: fail with the fix, never skip
    pytest.fail("mlflow is not installed; pip install mlflow (the tracking server these tests start needs the "
                "full package, the job side mlflow-skinny), or pip install -e '.[test]'", pytrace=False)

MLFLOW_BIN = os.path.join(os.path.dirname(sys.executable), "mlflow")
STEPS = 12
SCRIPT = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                           "metrics_train.py")).read()  # STEPS steps: METRICS_TEST_STEPS unset
EVERY_STEP = "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.000001"  # a step event for every step, to compare


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` (SQLite backend store, artifacts in a temporary folder) on
    127.0.0.1 at a free port, in its own session (stopped with its process group at the end),
    without its job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: no huey consumers with
    15 worker threads for jobs the tracking API never starts). Yields its URI."""
    if not os.path.exists(MLFLOW_BIN):
        pytest.fail(f"no mlflow server at {MLFLOW_BIN}; pip install mlflow (or pip install -e '.[test]')",
                    pytrace=False)
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen([MLFLOW_BIN, "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(root),
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                MlflowClient(tracking_uri=uri).search_experiments()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}",
                                pytrace=False)
                time.sleep(0.5)
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own session: it and its workers
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))]


def job_run(client: MlflowClient, job_dir: str, job_id: str):
    """The job's run from ``mlflow-run.json``, checked to be the only run tagged with the job's id."""
    with open(os.path.join(job_dir, "mlflow-run.json")) as f:
        saved = json.load(f)
    runs = client.search_runs([saved["experiment_id"]], f"tags.`hyperpod_lab.job_id` = '{job_id}'")
    assert [r.info.run_id for r in runs] == [saved["run_id"]], runs  # exactly one run for the job
    return runs[0]


def test_local_job_logs_params_loss_curve_and_markers(mlflow_server, client, tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # the submitting environment's
    job_id = cli.run(["submit", str(tmp_path / "train.py"), "--cluster", "local", "--nodes", "1",
                      "--procs-per-node", "1", "--name", "mlf-local", "--tracking", "mlflow",
                      "--checkpoint-every", "4", "--env", EVERY_STEP], client=client)
    rec = client.wait(job_id, timeout_s=180)
    assert rec.exit_code == 0, client.logs(job_id)[-3000:]
    assert rec.spec["tracking"] == "mlflow" and rec.spec["tracking_uri"] == mlflow_server  # resolved at submit
    events = client.event_reader(job_id).poll()
    faults = [e.data for e in events if e.kind == "fault.detected"]
    assert not faults, f"the job restarted unasked, rank 0's tracker killed with it: {faults}"
    mlf = MlflowClient(tracking_uri=mlflow_server)
    run = job_run(mlf, rec.job_dir, job_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "mlf-local"
    assert run.data.tags["hyperpod_lab.state"] == "succeeded" and run.data.tags["hyperpod_lab.job_dir"] == rec.job_dir
    params = run.data.params
    assert params["nodes"] == "1" and params["procs_per_node"] == "1" and params["tracking"] == "mlflow"
    assert params["checkpoint.every_steps"] == "4" and params["resiliency.max_retries"] == "3"
    assert json.loads(params["env"]) == {"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.000001"}
    losses = [(e.data["step"], e.data["loss"]) for e in events if e.kind == "step"]
    assert [s for s, _ in losses] == list(range(STEPS))
    assert history(mlf, run.info.run_id, "loss") == [(s, pytest.approx(v)) for s, v in losses], \
        (run.data.metrics, [ln for ln in client.logs(job_id).splitlines() if "MLflow" in ln])  # the loss curve
    assert history(mlf, run.info.run_id, "tokens_per_s") == [(s, 1600.0) for s in range(STEPS)]
    rates = history(mlf, run.info.run_id, "steps_per_s")  # null on the first step event: not logged
    assert [s for s, _ in rates] == list(range(1, STEPS)) and all(v > 0 for _, v in rates)
    assert "note" not in run.data.metrics  # not a number
    saved = sorted({e.data["step"] for e in events if e.kind == "checkpoint.saved" and e.writer == "rank-0"
                    and e.data.get("tier") == "persistent"})
    assert saved == [3, 7, 11] and history(mlf, run.info.run_id, "checkpoint/persistent") == [(s, s) for s in saved]
    from hyperpod_lab.goodput.measure import measure_from_events
    goodput = measure_from_events(events)["goodput"]
    assert history(mlf, run.info.run_id, "goodput") == [(STEPS - 1, pytest.approx(goodput))] and 0 < goodput <= 1


def test_slurm_job_restart_logs_into_the_same_run(mlflow_server, dev_cluster, client, tmp_path):
    """Must-show: on the dev cluster (2 nodes x 1 rank) rank 1 is killed by ``inject-fault``
    after step 4; the restarted job's rank 0 resumes the same MLflow run: its params, the loss
    curve (steps redone after the restore logged again), the fault and recovery markers, and
    exactly one run tagged with the job's id."""
    (tmp_path / "train.py").write_text(SCRIPT)
    spec = JobSpec(script=str(tmp_path / "train.py"), name="mlf-slurm", cluster="local-slurm", nodes=2,
                   procs_per_node=1, env={"METRICS_TEST_STEP_SLEEP": "0.6", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.000001"},
                   tracking="mlflow", tracking_uri=mlflow_server).validate()
    rec = client.submit(spec)
    try:
        _restart_into_the_same_run(client, rec, mlflow_server)
    finally:
        if not client.status(rec.job_id).state.is_terminal():  # a failed check: leave the cluster idle
            client.cancel(rec.job_id)


def _restart_into_the_same_run(client, rec, mlflow_server: str) -> None:
    job_id = rec.job_id
    reader, events, deadline = client.event_reader(job_id), [], time.monotonic() + 180
    run_file = os.path.join(rec.job_dir, "mlflow-run.json")  # the run exists before the fault
    while not (any(e.kind == "step" and e.data["step"] >= 4 for e in events) and os.path.exists(run_file)):
        assert time.monotonic() < deadline, client.logs(job_id)[-3000:]
        assert not any(e.kind == "step" and e.data["step"] >= STEPS - 2 for e in events), \
            f"no MLflow run before step {STEPS - 2}: {client.logs(job_id)[-3000:]}"
        events += reader.poll()
        time.sleep(0.2)
    mlf = MlflowClient(tracking_uri=mlflow_server)
    first_run = job_run(mlf, rec.job_dir, job_id).info.run_id  # created by the first start, before the fault
    cli.run(["inject-fault", job_id, "--rank", "1"], client=client)
    rec = client.wait(job_id, timeout_s=240)
    assert rec.exit_code == 0, client.logs(job_id)[-3000:]
    events = client.event_reader(job_id).poll()
    done = next(e for e in events if e.kind == "recovery.completed")
    run = job_run(mlf, rec.job_dir, job_id)
    assert run.info.run_id == first_run and run.info.status == "FINISHED"
    assert run.data.params["nodes"] == "2" and run.data.params["cluster"] == "local-slurm"
    assert run.data.tags["hyperpod_lab.state"] == "succeeded" and run.data.tags["hyperpod_lab.recoveries"] == "1"
    steps = [(e.data["step"], e.data["loss"]) for e in events if e.kind == "step"]
    assert len(steps) >= STEPS  # steps redone after the restore: logged again
    restored = done.data["restored_step"] + 1  # the first step after the restart
    # The loss curve: the steps before the fault as a prefix (events queued in the killed rank 0's last
    # second may not have been sent: docs/tracking.md), then every step of the restarted rank 0.
    fault = next(e for e in events if e.kind == "fault.detected")
    cut = next((i for i in range(1, len(steps)) if steps[i][0] <= steps[i - 1][0]),  # the restart redoes steps
               sum(1 for e in events if e.kind == "step" and e.time < fault.time))  # (or resumes right after)
    before, after = steps[:cut], steps[cut:]
    assert after and after[0][0] == restored, (before, after)
    got = history(mlf, run.info.run_id, "loss")
    sent_before = len(got) - len(after)
    assert 0 < sent_before <= len(before) and len(before) - sent_before <= 2, (got, steps)  # <= 1 s at 0.6 s/step
    assert got == [(s, pytest.approx(v)) for s, v in before[:sent_before] + after], (got, steps)
    assert history(mlf, run.info.run_id, "recovery/restart_count") == [(restored, float(done.data["restart_count"]))]
    assert history(mlf, run.info.run_id, "recovery/downtime_s") == [(restored, pytest.approx(done.data["downtime_s"]))]
    last_before = max(e.data["step"] for e in events if e.kind == "step" and e.time < fault.time)
    assert history(mlf, run.info.run_id, "fault") == [(last_before, 1.0)]
    assert "rank 1" in run.data.tags["hyperpod_lab.fault.1"], run.data.tags


def test_a_down_server_neither_stops_nor_slows_the_job(client, tmp_path):
    """The tracking URI names a loopback port nobody listens on: the job completes, rank 0's log
    holds exactly one warning, and its steps take no longer than without tracking would allow."""
    (tmp_path / "train.py").write_text(SCRIPT)
    down = f"http://127.0.0.1:{free_port()}"
    job_id = cli.run(["submit", str(tmp_path / "train.py"), "--cluster", "local", "--nodes", "1",
                      "--procs-per-node", "1", "--tracking", "mlflow", "--tracking-uri", down,
                      "--env", EVERY_STEP], client=client)
    rec = client.wait(job_id, timeout_s=180)
    log = client.logs(job_id)
    assert rec.exit_code == 0, log[-3000:]
    assert log.count("warning: MLflow tracking") == 1, log[-3000:]
    assert f"MLflow tracking: {down} failed" in log
    events = client.event_reader(job_id).poll()
    steps = [e.time for e in events if e.kind == "step"]
    assert len(steps) == STEPS
    # one request to the down server costs ~3 s (refused, 2 retries after 1 s and 2 s): steps that
    # waited for their step events' requests would take >= 33 s; 12 steps of ~0.03 s take < 1 s
    assert steps[-1] - steps[0] < 10.0, steps
    assert not os.path.exists(os.path.join(rec.job_dir, "mlflow-run.json"))


def test_failure_restart_and_a_lost_run_file_keep_one_run(mlflow_server, tmp_path):
    """Without a job (the tracker on its own, the module's server): rank 0 leaving with an
    exception marks the run failed; the next start (its ``mlflow-run.json`` deleted, as if rank 0
    died before writing it) finds the run by its job-id tag and sets it running again: one run."""
    spec = JobSpec(script="t.py", name="mlf-unit", tracking="mlflow", tracking_uri=mlflow_server).validate()
    job_dir = str(tmp_path)

    def started(tracker):
        tracker.event(Event(kind="started", time=time.time(), writer="rank-0", seq=0, job_id="unit-job", data={}))
        assert tracker.sync(60) and tracker.error is None, tracker.error

    first = mlflow_tracking.MlflowTracking(spec, job_dir, "unit-job")
    started(first)
    first.failed(RuntimeError("boom"))
    assert first.close()  # what the context's teardown does next
    mlf = MlflowClient(tracking_uri=mlflow_server)
    run = mlf.get_run(first.run_id)
    assert run.info.status == "FAILED" and run.data.tags["hyperpod_lab.state"] == "failed"
    assert run.data.tags["hyperpod_lab.error"] == "RuntimeError: boom" and run.data.params["name"] == "mlf-unit"
    os.unlink(os.path.join(job_dir, "mlflow-run.json"))
    second = mlflow_tracking.MlflowTracking(spec, job_dir, "unit-job", is_restart=True)
    started(second)
    assert second.close() and second.run_id == first.run_id
    run = mlf.get_run(first.run_id)
    assert run.info.status == "RUNNING" and run.data.tags["hyperpod_lab.state"] == "running"
    job_run(mlf, job_dir, "unit-job")  # the file again, and one run with the tag


def test_a_slow_server_never_blocks_the_caller(tmp_path):
    """A server that accepts connections and never answers (a listening socket nobody reads):
    :meth:`MlflowTracking.event` returns at once, and :meth:`close` gives up after its timeout
    with one warning."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        spec = JobSpec(script="t.py", tracking="mlflow",
                       tracking_uri=f"http://127.0.0.1:{srv.getsockname()[1]}").validate()
        tracker = mlflow_tracking.MlflowTracking(spec, str(tmp_path), "slow-job")
        t0 = time.monotonic()
        for step in range(2000):
            tracker.event(Event(kind="step", time=time.time(), writer="rank-0", seq=step, job_id="slow-job",
                                data={"step": step, "loss": 1.0}), step)
        queued_s = time.monotonic() - t0
        t1 = time.monotonic()
        assert tracker.close(timeout_s=1.0) is False  # still waiting for the server
        closed_s = time.monotonic() - t1
    assert queued_s < 0.5, queued_s  # 2,000 events; ~1 us each when nothing else runs
    assert 0.9 < closed_s < 5.0, closed_s
    assert tracker.run_id is None


def test_spec_fields_and_flags(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = JobSpec(script="t.py").validate()
    assert (spec.tracking, spec.tracking_uri) == ("off", None)
    with pytest.raises(SpecError, match=r"tracking_uri: .*--tracking-uri URI .* MLFLOW_TRACKING_URI"):
        JobSpec(script="t.py", tracking="mlflow").validate()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    spec = JobSpec(script="t.py", tracking="mlflow").validate()
    assert json.loads(spec.to_json())["tracking_uri"] == "http://mlflow.example:5000"  # recorded in spec.json
    assert JobSpec.from_json(spec.to_json()).tracking_uri == "http://mlflow.example:5000"
    assert JobSpec(script="t.py", tracking="mlflow", tracking_uri="http://other:80").validate().tracking_uri == \
        "http://other:80"  # the spec's own wins
    with pytest.raises(SpecError, match=r"tracking: must be one of off, mlflow, got 'wandb'"):
        JobSpec(script="t.py", tracking="wandb").validate()
    with pytest.raises(SpecError, match=r"tracking_uri: contains a password .*--secret-env MLFLOW_TRACKING_PASSWORD"):
        JobSpec(script="t.py", tracking="mlflow", tracking_uri="https://me:s3cret@mlflow.example").validate()
    assert JobSpec(script="t.py", tracking="mlflow", tracking_uri="https://me@mlflow.example").validate()
    with pytest.raises(SpecError, match=r"tracking_uri: must be at most 2000 printable"):
        JobSpec(script="t.py", tracking="mlflow", tracking_uri="http://x\n").validate()
    parse = cli.build_parser().parse_args
    assert (parse(["submit", "t.py"]).tracking, parse(["submit", "t.py"]).tracking_uri) == ("off", None)
    a = parse(["submit", "t.py", "--tracking", "mlflow", "--tracking-uri", "http://h:5000"])
    assert (a.tracking, a.tracking_uri) == ("mlflow", "http://h:5000")
    from mlflow.utils import validation  # the limits the tracker batches and truncates by are MLflow's own
    assert (mlflow_tracking.MAX_PARAM_CHARS, mlflow_tracking.MAX_TAG_CHARS, mlflow_tracking.MAX_METRICS_PER_BATCH,
            mlflow_tracking.MAX_PARAMS_TAGS_PER_BATCH) == (
        validation.MAX_PARAM_VAL_LENGTH, validation.MAX_TAG_VAL_LENGTH, validation.MAX_METRICS_PER_BATCH,
        validation.MAX_PARAMS_TAGS_PER_BATCH)
    assert mlflow_tracking.flatten({"nodes": 2, "args": ["--steps", "5"], "partition": None,
                                    "resiliency": {"max_retries": 3, "spares": 0}}) == {
        "nodes": "2", "args": '["--steps", "5"]', "partition": "null", "resiliency.max_retries": "3",
        "resiliency.spares": "0"}
