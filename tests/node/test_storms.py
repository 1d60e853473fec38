"""Restart storms (issue 15 item 3): a job whose restarts make no progress, or fail with the same
fault, stops retrying: ``job.failed`` {reason, restarts, fault, requeue: false}, exit status 3,
and on Slurm no requeue (``Requeue=0``).

The counting (:class:`StormPolicy`) and the guard over real event files (:class:`StormGuard`)
are tested on their own; the launch agent on the local backend with a script whose every start
fails (tests/scripts/always_fails.py) and with one whose every start gets further (no storm);
the supervisor's relaunches with its Slurm commands replaced by fakes; and the whole job on the
real dev cluster (Slurm keeps it FAILED, Restarts=0, Requeue=0, never PENDING again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.events import EventKind, EventReader, EventWriter
from hyperpod_lab.node import storm
from hyperpod_lab.node.storm import STORM_EXIT, Fault, StormGuard, StormPolicy
from hyperpod_lab.spec import JobSpec, ResiliencyPolicy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALWAYS_FAILS = os.path.join(REPO, "tests", "scripts", "always_fails.py")
BOOM = Fault(0, "n1", "RuntimeError: boom")


# ---- the counting -------------------------------------------------------------------------
def test_every_start_failing_stops_after_k_restarts():
    p = StormPolicy(3)
    verdicts = [p.on_failure(progressed=False, checkpointed=False, fault=BOOM) for _ in range(4)]
    assert verdicts[:3] == [None, None, None]  # the first failure, then restarts 1 and 2 failing
    v = verdicts[3]
    assert v is not None and v["restarts"] == 3 and v["criterion"] == "no progress"
    assert "3 restarts in a row made no step progress" in v["reason"] and "rank 0 on n1: RuntimeError: boom" in v["reason"]


def test_progress_resets_the_count():
    p = StormPolicy(2)
    faults = [Fault(0, "n1", f"error {i}") for i in range(10)]  # all different: only progress counts
    for i, f in enumerate(faults):
        v = p.on_failure(progressed=(i % 2 == 1), checkpointed=False, fault=f)
        assert v is None, (i, v)  # never two restarts in a row without progress
    assert p.restarts == 10
    assert p.on_failure(progressed=False, checkpointed=False, fault=Fault(1, "n1", "x")) is None
    assert p.on_failure(progressed=False, checkpointed=False, fault=Fault(2, "n1", "y"))["criterion"] == "no progress"


def test_the_same_fault_with_progress_but_no_new_checkpoint_is_a_storm():
    """A run that gets a few steps further each time (progress) but dies of the same exception
    before it can save anything: the same fault K times in a row."""
    p = StormPolicy(3)
    for _ in range(3):
        assert p.on_failure(progressed=True, checkpointed=False, fault=BOOM) is None
    v = p.on_failure(progressed=True, checkpointed=False, fault=BOOM)
    assert v is not None and v["criterion"] == "same fault" and v["fault"] == "rank 0 on n1: RuntimeError: boom"
    assert "the same fault ended 3 restarts in a row" in v["reason"]


def test_a_fault_that_recurs_after_new_checkpoints_is_no_storm():
    """A rank killed once an hour (the recovery benchmark kills rank 1 every MTBF): each restart
    saves new progress before the next kill, so the job gets further every time."""
    p = StormPolicy(2)
    kill = Fault(1, "n1", "worker killed by SIGKILL")
    for _ in range(20):
        assert p.on_failure(progressed=True, checkpointed=True, fault=kill) is None


def test_another_fault_in_between_resets_the_same_fault_count():
    p = StormPolicy(2)
    other = Fault(1, "n2", "worker killed by SIGKILL")
    for f in (BOOM, BOOM, other, BOOM, other, BOOM):
        assert p.on_failure(progressed=True, checkpointed=False, fault=f) is None


def test_k_of_one_and_bad_k():
    p = StormPolicy(1)
    assert p.on_failure(progressed=False, checkpointed=False, fault=None) is None  # not a restart yet
    assert p.on_failure(progressed=False, checkpointed=False, fault=None)["restarts"] == 1
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError):
            StormPolicy(bad)


def test_what_makes_two_faults_the_same():
    a = Fault(3, "n2", "RuntimeError: tensor at 0x7f3a2c001e40 broke in pid 123456 at 1795395723.41")
    b = Fault(3, "n2", "RuntimeError: tensor at 0x55d0aa0b2e10 broke in pid 98765 at 1795395799.02")
    assert a.key() == b.key()
    assert a.key() != Fault(4, "n2", a.reason).key()  # another rank
    assert a.key() != Fault(3, "n3", a.reason).key()  # another node
    assert Fault(0, "n1", "worker killed by SIGKILL").key() != Fault(0, "n1", "worker killed by SIGSEGV").key()
    assert Fault(0, "n1", "worker exited with code 1").key() != Fault(0, "n1", "worker exited with code 2").key()


def test_state_round_trips():
    p = StormPolicy(3)
    p.on_failure(progressed=False, checkpointed=False, fault=BOOM)
    p.on_failure(progressed=False, checkpointed=False, fault=BOOM)
    q = StormPolicy(3, json.loads(json.dumps(p.to_dict())))
    assert q.on_failure(progressed=False, checkpointed=False, fault=BOOM) is None
    assert q.on_failure(progressed=False, checkpointed=False, fault=BOOM)["restarts"] == 3


# ---- the guard over a job's event files -----------------------------------------------------
def _step(job_dir, step, job_id="j"):
    EventWriter(job_dir, "rank-0", job_id).emit(EventKind.STEP, step=step, loss=1.0)


def _job_failed(job_dir):
    return [e for e in EventReader(job_dir).poll() if e.kind == EventKind.JOB_FAILED.value]


def test_guard_reads_progress_from_step_events_and_declares_once(tmp_path):
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    for s in range(50):  # history before the agent started: never read again
        _step(job_dir, s)
    agent_a = StormGuard(job_dir, EventWriter(job_dir, "agent-n1", "j"), 2)
    agent_b = StormGuard(job_dir, EventWriter(job_dir, "agent-n2", "j"), 2)
    assert agent_a.probe.step == -1
    f = [Fault(0, "n1", f"RuntimeError: boom {i}") for i in range(4)]  # different faults: progress decides
    _step(job_dir, 40)  # restored from step 39: steps 40..45, then it fails
    _step(job_dir, 45)
    assert agent_a.failure(f[0]) is None  # the first failure
    _step(job_dir, 46)  # beyond 45: progress
    assert agent_a.failure(f[1]) is None
    assert agent_a.failure(f[2]) is None  # restart 2 failed without progress (1 in a row)
    _step(job_dir, 40)
    _step(job_dir, 46)  # no further than before: no progress
    v = agent_a.failure(BOOM)
    assert v is not None and v["restarts"] == 3 and v["requeue"] is False and v["exit_code"] == STORM_EXIT
    assert agent_b.failure(Fault(1, "n2", "peer died")) == storm.declared(job_dir)  # it stops too ...
    failed = _job_failed(job_dir)
    assert len(failed) == 1 and failed[0].writer == "agent-n1"  # ... and writes no second job.failed
    d = failed[0].data
    assert d["requeue"] is False and d["restarts"] == 3 and d["fault"] == "rank 0 on n1: RuntimeError: boom"
    assert d["reason"].startswith("restart storm: 2 restarts in a row made no step progress")


@pytest.mark.parametrize("durable", [False, True])
def test_a_repeated_fault_with_progress_but_no_checkpoint(tmp_path, durable):
    """Rank 1 killed again and again while the job gets further every time, with no checkpoint:
    in a restart job that progress is lost at each restart (a storm after K); in a
    checkpointless job the surviving replicas keep it (the recovery benchmark kills rank 1 every
    MTBF seconds): no storm."""
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    guard = StormGuard(job_dir, EventWriter(job_dir, "agent-n1", "j"), 2, steps_are_durable=durable)
    kill = Fault(1, "n1", "worker killed by SIGKILL")
    verdicts = []
    for i in range(6):
        _step(job_dir, 10 * (i + 1))  # further every time
        verdicts.append(guard.failure(kill))
    if durable:
        assert verdicts == [None] * 6 and not _job_failed(job_dir)
    else:
        assert verdicts[:2] == [None, None] and verdicts[2]["criterion"] == "same fault"
        assert "the same fault ended 2 restarts in a row with no new checkpoint" in verdicts[2]["reason"]


def test_supervisor_counts_survive_a_requeue(tmp_path):
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    state = os.path.join(job_dir, "storm-supervisor.json")
    sup = StormGuard(job_dir, EventWriter(job_dir, "supervisor", "j"), 2, state)
    _step(job_dir, 10)
    assert sup.failure(Fault(None, "n2", "node down")) is None  # first failure: requeue
    requeued = StormGuard(job_dir, EventWriter(job_dir, "supervisor", "j"), 2, state)  # a new process
    _step(job_dir, 5)  # restored an old checkpoint, did not get past step 10
    assert requeued.failure(Fault(None, "n3", "node down")) is None
    again = StormGuard(job_dir, EventWriter(job_dir, "supervisor", "j"), 2, state)
    v = again.failure(Fault(None, "n1", "node down"))
    assert v is not None and v["restarts"] == 2 and v["criterion"] == "no progress"
    assert [e.writer for e in _job_failed(job_dir)] == ["supervisor"]


def test_a_stopped_job_started_again_exits_3_at_once(tmp_path):
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    storm.refuse_if_declared(job_dir)  # no storm: nothing happens
    assert storm.declare(job_dir, EventWriter(job_dir, "agent-n1", "j"),
                         {"reason": "restart storm: test", "restarts": 3, "fault": None})
    assert not storm.declare(job_dir, EventWriter(job_dir, "agent-n2", "j"), {"reason": "again", "restarts": 3})
    with pytest.raises(SystemExit) as e:
        storm.refuse_if_declared(job_dir)
    assert e.value.code == STORM_EXIT
    env = {**os.environ, "HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": "j"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node", "1",
                          ALWAYS_FAILS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == STORM_EXIT, out.stderr[-2000:]
    assert "not starting: restart storm: test" in out.stdout
    assert not os.path.exists(os.path.join(job_dir, "logs")) and len(_job_failed(job_dir)) == 1
    assert time.monotonic() - t0 < 60


# ---- the spec field and the flag -------------------------------------------------------------
def test_storm_restarts_in_the_spec_and_on_the_command_line():
    assert ResiliencyPolicy().storm_restarts == 3
    for bad in (0, -2, 1001, True, 2.5, "3", None):
        with pytest.raises(SpecError) as e:
            JobSpec.from_dict({"script": "t.py", "resiliency": {"storm_restarts": bad}})
        assert e.value.field == "resiliency.storm_restarts" and "--storm-restarts" in str(e.value)
    assert JobSpec.from_dict({"script": "t.py", "resiliency": {"storm_restarts": 5}}).resiliency.storm_restarts == 5
    a = cli.build_parser().parse_args(["submit", "t.py", "--storm-restarts", "7"])
    assert cli.spec_from_args(a, []).resiliency.storm_restarts == 7
    a = cli.build_parser().parse_args(["submit", "t.py"])
    assert cli.spec_from_args(a, []).resiliency.storm_restarts == 3


# ---- the local backend ----------------------------------------------------------------------
def _events(client, job_id):
    return client.event_reader(job_id).poll()


def test_local_job_whose_every_start_fails_stops_after_k_restarts(client):
    """Must show (local backend): K = 2, max_retries 10: two restarts, then job.failed with the
    reason, exit status 3, no third restart."""
    job_id = cli.run(["submit", ALWAYS_FAILS, "--cluster", "local", "--nodes", "1", "--procs-per-node", "2",
                      "--max-retries", "10", "--storm-restarts", "2", "--no-health-checks"], client=client)
    rec = client.wait(job_id, timeout_s=240)
    events = _events(client, job_id)
    assert rec.status == "failed", client.logs(job_id)[-3000:]
    failed = [e for e in events if e.kind == "job.failed"]
    assert len(failed) == 1, [e.describe() for e in events]
    d = failed[0].data
    assert d["restarts"] == 2 and d["requeue"] is False and d["exit_code"] == STORM_EXIT
    assert "restart storm" in d["reason"] and "always fails: this run cannot train" in d["fault"]
    assert [e.data["restart_count"] for e in events if e.kind == "recovery.started"] == [1, 2]
    assert [e for e in events if e.kind == "finished"][-1].data["exit_code"] == STORM_EXIT
    assert "hyperpod-lab: restart storm: 2 restarts in a row made no step progress" in client.logs(job_id)


def test_local_job_that_gets_further_every_start_is_no_storm(client, tmp_path):
    """The control: every start fails, but each one a few steps further than the last (a new
    high-water mark each time) and with a different fault: torchrun's max_retries ends it, with
    torchrun's status 1 and no job.failed."""
    script = tmp_path / "further.py"
    script.write_text(
        "import os, time\nimport hyperpod_lab.runtime as hp\n"
        "n = 3 + 3 * int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))\n"
        "with hp.init() as ctx:\n"
        "    for s in range(n):\n"
        "        time.sleep(0.05)\n"
        "        ctx.step(s, loss=1.0)\n"
        "    raise RuntimeError(f'failed after {n} steps')\n")
    job_id = cli.run(["submit", str(script), "--cluster", "local", "--nodes", "1", "--procs-per-node", "1",
                      "--max-retries", "3", "--storm-restarts", "1", "--no-health-checks",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001"], client=client)
    rec = client.wait(job_id, timeout_s=240)
    events = _events(client, job_id)
    assert rec.status == "failed"
    assert not [e for e in events if e.kind == "job.failed"], [e.describe() for e in events]
    assert len([e for e in events if e.kind == "recovery.started"]) == 3
    assert [e for e in events if e.kind == "finished"][-1].data["exit_code"] == 1


# ---- the supervisor, with its Slurm commands faked -------------------------------------------
class _FakeSlurm:
    """The supervisor's view of Slurm: every training step ends at once, every time with a node
    lost; ``scontrol update ... Requeue=0`` recorded."""

    def __init__(self, monkeypatch, sup_mod, nodes):
        self.nodes, self.lost_calls, self.calls = list(nodes), 0, []
        monkeypatch.setattr(sup_mod, "job_nodes", lambda _id: list(self.nodes))
        monkeypatch.setattr(sup_mod, "node_states", lambda ns: {n: "idle" for n in ns})
        monkeypatch.setattr(sup_mod, "node_addr", lambda n: n)
        monkeypatch.setattr(sup_mod, "node_reason", lambda n: None)
        real_call = subprocess.call

        def call(argv, **kw):
            if argv and argv[0] == "scontrol":
                self.calls.append(list(argv))
                return 0
            return real_call(argv, **kw)
        monkeypatch.setattr(sup_mod.subprocess, "call", call)


def _supervisor(sup_mod, job_dir, **kw):
    args = dict(nodes=1, spares=8, mode="restart", launch=[sys.executable, "-c", "raise SystemExit(1)"],
                srun_opts=[], procs_per_node=1, health=False, health_args=[], requeue=True,
                python=sys.executable, slurm_job_id="4242", restart=0)
    args.update(kw)
    sup = sup_mod.Supervisor(job_dir, "j", **args)
    sup._srun = lambda nodes, command, env=None: subprocess.Popen(command)  # the step: exits 1 at once
    return sup


def test_supervisor_stops_relaunching_after_k_node_losses_without_progress(tmp_path, monkeypatch):
    from hyperpod_lab.node import supervisor as sup_mod
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    spec = tmp_path / "spec.json"
    spec.write_text(JobSpec(script="t.py", resiliency=ResiliencyPolicy(storm_restarts=2)).to_json())
    monkeypatch.setenv("HYPERPOD_LAB_SPEC", str(spec))
    fake = _FakeSlurm(monkeypatch, sup_mod, [f"n{i}" for i in range(1, 10)])
    sup = _supervisor(sup_mod, job_dir)
    launched = []
    start = sup.start_restart_step

    def start_and_lose(nodes):
        launched.append(list(nodes))
        start(nodes)
    monkeypatch.setattr(sup, "start_restart_step", start_and_lose)
    monkeypatch.setattr(sup, "lost_nodes", lambda nodes: {nodes[0]: "down*"})  # every run loses its node
    monkeypatch.setattr(sup_mod, "FAULTS_TO_EXCLUDE", 99)
    assert sup.run() == STORM_EXIT
    assert len(launched) == 3, launched  # the first run and two relaunches, then the storm
    assert ["scontrol", "update", "JobId=4242", "Requeue=0"] in fake.calls
    assert not [c for c in fake.calls if c[1] == "requeue"]
    failed = _job_failed(job_dir)
    assert len(failed) == 1 and failed[0].writer == "supervisor" and failed[0].data["restarts"] == 2
    assert "restart storm: 2 restarts in a row made no step progress" in failed[0].data["reason"]
    # the job, started again (a requeue by hand): stops at once, launches nothing
    again = _supervisor(sup_mod, job_dir)
    again.start_restart_step = lambda nodes: pytest.fail("a stopped job launched a step")
    assert again.run() == STORM_EXIT and len(_job_failed(job_dir)) == 1


def test_supervisor_relaunches_a_job_that_progresses(tmp_path, monkeypatch):
    """The control: the same node losses, but every run completes (and checkpoints) steps beyond
    the last one's: the supervisor relaunches every time (until the training finishes)."""
    from hyperpod_lab.node import supervisor as sup_mod
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    monkeypatch.delenv("HYPERPOD_LAB_SPEC", raising=False)  # K = 3 (the default)
    fake = _FakeSlurm(monkeypatch, sup_mod, [f"n{i}" for i in range(1, 10)])
    sup = _supervisor(sup_mod, job_dir)
    runs = []
    start = sup.start_restart_step

    def start_and_step(nodes):
        runs.append(nodes)
        _step(job_dir, 10 * len(runs))  # each run gets further and saves it
        EventWriter(job_dir, "rank-0", "j").emit(EventKind.CHECKPOINT_SAVED, tier="persistent", step=10 * len(runs))
        if len(runs) == 6:
            EventWriter(job_dir, "rank-0", "j").emit(EventKind.FINISHED, status="succeeded", steps=60)
        start(nodes)
    monkeypatch.setattr(sup, "start_restart_step", start_and_step)
    monkeypatch.setattr(sup, "lost_nodes", lambda nodes: {nodes[0]: "down*"})
    monkeypatch.setattr(sup_mod, "FAULTS_TO_EXCLUDE", 99)
    assert sup.run() == 0 and len(runs) == 6
    assert not _job_failed(job_dir) and not [c for c in fake.calls if "Requeue=0" in c]


# ---- the dev cluster ------------------------------------------------------------------------
def _scontrol_job(native_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", native_id], capture_output=True, text=True)
    return out.stdout


def _sacct(native_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", native_id, "-o", "State,ExitCode"],
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()


def test_dev_cluster_job_whose_every_start_fails_is_not_requeued(dev_cluster, client):
    """Must show (Slurm): a 2-node job (submitted with --requeue, auto_resume on) whose every start
    raises stops after K = 2 restarts with job.failed; the batch script exits 3, sacct says FAILED
    3:0, scontrol shows Requeue=0 and Restarts=0, and the job never becomes PENDING again."""
    job_id = cli.run(["submit", ALWAYS_FAILS, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--max-retries", "10", "--storm-restarts", "2", "--name", "storm",
                      "--env", "RUST_LOG=warn"], client=client)
    rec = client.wait(job_id, timeout_s=400)
    native = client.get(job_id).native_id
    events = _events(client, job_id)
    log = client.logs(job_id)
    assert rec.status == "failed", log[-4000:]
    failed = [e for e in events if e.kind == "job.failed"]
    assert len(failed) == 1, [e.describe() for e in events]
    assert failed[0].data["restarts"] == 2 and failed[0].data["requeue"] is False
    assert "always fails: this run cannot train" in failed[0].data["fault"]
    assert failed[0].writer.startswith("agent-")
    assert "no requeue (scontrol update Requeue=0: done); exit 3" in log, log[-4000:]
    assert "step exited with 3" in log
    job = _scontrol_job(native)
    assert " Requeue=0 " in f" {job} " and " Restarts=0 " in f" {job} ", job
    deadline = time.monotonic() + 60
    while not (_sacct(native) and _sacct(native)[-1].startswith("FAILED")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sacct(native)[-1] == "FAILED|3:0", _sacct(native)
    time.sleep(5)  # nothing puts it back in the queue
    assert "JobState=FAILED" in _scontrol_job(native) and " Restarts=0 " in f" {_scontrol_job(native)} "
    assert client.status(job_id).status == "failed"
