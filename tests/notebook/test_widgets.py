"""The notebook monitor (ipywidgets) on real jobs: its model follows the job's events, the
progress bar advances, it stops when the job ends; ``%hyperpod watch`` and ``job.monitor()``;
and a real kernel (the "Python 3 (HyperPod)" kernel spec) run headless through nbclient."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient

from hyperpod_lab.events import Event
from hyperpod_lab.fold.aggregate import mark_label
from hyperpod_lab.notebook.widgets import JobMonitor, timeline_html

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import time
import hyperpod_lab.runtime as hp
with hp.init() as ctx:
    for step in range(12):
        time.sleep(0.25)
        ctx.step(step, loss=float(12 - step), total_steps=12)
    ctx.finish(final_loss=1.0)
"""


@pytest.fixture
def shell(ipython, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    return ipython


def submit_args():
    return "submit train.py --cluster local --nodes 1 --procs-per-node 1 --env HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.05"


def test_job_handle_monitor_follows_a_real_job(shell):
    from hyperpod_lab.notebook.handle import Job

    job = shell.run_line_magic("hyperpod", submit_args())
    assert isinstance(job, Job) and isinstance(job, str) and job.startswith("train-")
    mon = job.monitor(interval_s=0.2, status_interval_s=1.0, plot_interval_s=0.5)
    seen, drawn = [], []
    mon.bar.observe(lambda ch: seen.append(ch["new"]), names="value")
    # the monitor's thread sets plot.value after plot_series; mon.events is not changing meanwhile
    mon.plot.observe(lambda ch: drawn.append((bytes(ch["new"]), list(zip(mon.plot_series["step"], mon.plot_series["loss"])),
                                               [(e.data["step"], e.data["loss"]) for e in mon.events
                                                if e.kind == "step"])), names="value")
    busy_until = time.monotonic() + 3
    while time.monotonic() < busy_until:  # the kernel's main thread is busy; the monitor goes on
        sum(range(10000))
    assert mon.wait(180).done.is_set()
    assert not mon._thread.is_alive()
    assert len(set(seen)) >= 3 and seen == sorted(seen), seen  # advanced in several updates
    assert mon.bar.value == mon.bar.max == 12 and mon.bar.bar_style == "success"
    assert mon.state == "completed" and mon.progress.loss == 1.0 and mon.progress.step == 11
    kinds = [e.kind for e in mon.events]
    assert kinds[0] == "submitted" and kinds[-1] == "finished" and kinds.count("step") >= 6
    assert "completed" in mon.header.value and "monitor stopped" in mon.header.value
    assert "finished: succeeded" in mon.timeline.value
    # the plot: a PNG redrawn as steps arrived, each time from exactly the steps that had arrived
    assert mon.plot.format == "png" and mon.plot_png.startswith(b"\x89PNG\r\n\x1a\n") and bytes(mon.plot.value) == mon.plot_png
    assert len(drawn) >= 3 and len({png for png, _, _ in drawn}) == len(drawn), len(drawn)  # each one different
    for _, plotted, arrived in drawn:
        assert plotted == arrived and plotted, (plotted, arrived)
    assert drawn[-1][1] == [(e.data["step"], e.data["loss"]) for e in mon.events if e.kind == "step"]
    assert [x for x, _ in drawn[-1][1]][-1] == 11 and "loss 1 at step 11" in mon.plot_status.value
    assert job.status() == "completed" and job.wait(5).exit_code == 0 and job.events()[-1].kind == "finished"
    # %hyperpod watch on the ended job: shows the whole history, stops by itself
    again = shell.run_line_magic("hyperpod", f"watch {job}")
    assert isinstance(again, JobMonitor) and again.wait(30).bar.value == 12
    assert "application/vnd.jupyter.widget-view+json" in again._repr_mimebundle_()


def test_watch_errors_are_messages(shell, capsys):
    assert shell.run_line_magic("hyperpod", "watch nope-1") is None
    assert "unknown job 'nope-1'" in capsys.readouterr().err
    assert shell.run_line_magic("hyperpod", "watch") is None
    assert "give one job id" in capsys.readouterr().err


def test_timeline_marks_faults_red_and_recoveries_green_with_downtime():
    ev = [Event("started", "j", 100.0, "rank-0", 0, {}),
          Event("fault.detected", "j", 103.0, "agent-n2", 0, {"rank": 1, "node": "n2", "signal": "SIGKILL"}),
          Event("recovery.completed", "j", 107.5, "rank-0", 1,
                {"downtime_s": 4.5, "restored_from": "memory", "restored_step": 9})]
    out = timeline_html(ev)
    fault = out[out.index("hp-fault-detected"):]
    assert "#d32f2f" in fault.split("</span>")[0] and "rank 1 on n2 (SIGKILL)" in fault
    rec = out[out.index("hp-recovery-completed"):]
    assert "#2e7d32" in rec.split("</span>")[0] and "recovered in 4.5 s from memory" in rec and "+7.5s" in rec


def test_timeline_names_the_node_of_health_checks_exclusions_and_node_down():
    ok = {"status": "passed", "detail": "", "seconds": 0.1}
    ev = [Event("submitted", "j", 100.0, "client", 0, {}),
          Event("health.checked", "j", 102.0, "health-n1", 0, {"node": "n1", "ok": True, "seconds": 1.25,
                                                                "checks": {"gpu": ok, "shm": ok}}),
          Event("health.failed", "j", 102.5, "health-n2", 0, {"node": "n2", "check": "shm",
                                                               "detail": "/dev/shm is 64 MiB, needs 1 GiB"}),
          Event("health.checked", "j", 102.5, "health-n2", 1, {"node": "n2", "ok": False, "seconds": 2.0, "checks": {
              "gpu": ok, "shm": {"status": "failed", "detail": "64 MiB"}}}),
          Event("node.excluded", "j", 102.6, "supervisor", 0, {"node": "n2", "reason": "health check failed: shm",
                                                                "faults": 0, "excluded": ["n2"]}),
          Event("node.excluded", "j", 150.0, "supervisor", 1, {"node": "n3", "reason": "faulted twice", "faults": 2,
                                                                "excluded": ["n2", "n3"]}),
          Event("fault.detected", "j", 160.0, "supervisor", 2, {"reason": "node down", "node": "n4", "rank": [6, 7],
                                                                 "slurm_state": "DOWN", "replica_group": 3})]
    assert [mark_label(e) for e in ev[1:]] == [
        "health checks passed on n1 (2 checks, 1.25 s)",
        "health check failed on n2: shm — /dev/shm is 64 MiB, needs 1 GiB",
        "health checks failed on n2: shm (2 s)",
        "n2 excluded: health check failed: shm",
        "n3 excluded: faulted twice (2 faults)",
        "fault: node n4 down (Slurm: DOWN), ranks 6, 7"]
    one = Event("fault.detected", "j", 161.0, "supervisor", 3, {"reason": "node down", "node": "n5", "rank": [8],
                                                                 "slurm_state": "DOWN*"})
    assert mark_label(one) == "fault: node n5 down (Slurm: DOWN*), rank 8"
    out = timeline_html(ev)
    for kind, color, text in [("health-checked", "#00796b", "+2.0s health checks passed on n1"),
                              ("health-failed", "#c62828", "health check failed on n2: shm — /dev/shm is 64 MiB"),
                              ("node-excluded", "#ef6c00", "+50.0s n3 excluded: faulted twice"),
                              ("fault-detected", "#d32f2f", "node n4 down (Slurm: DOWN)")]:
        marks = [m for m in out.split("<span class='hp-mark ")[1:] if m.startswith(f"hp-{kind}'")]
        assert any(color in m and text in m for m in marks), (kind, marks)
    failed_checks = [m for m in out.split("<span class='hp-mark ")[1:] if "health checks failed on n2" in m]
    assert len(failed_checks) == 1 and "#c62828" in failed_checks[0]  # a failed node's checks are red, not teal


def test_timeline_labels_hangs_stragglers_and_a_restart_storm():
    ev = [Event("submitted", "j", 100.0, "client", 0, {}),
          Event("fault.detected", "j", 140.0, "agent-n2", 0, {"reason": "hang", "rank": 1, "node": "n2",
                                                               "stalled_s": 31.2, "section": "forward"}),
          Event("straggler.detected", "j", 150.0, "agent-n1", 1, {"rank": 3, "node": "n1", "score": 2.04,
                                                                   "step_s": 0.42, "median_step_s": 0.21,
                                                                   "action": "report"}),
          Event("job.failed", "j", 170.0, "agent-n1", 2, {"reason": "restart storm: 3 restarts in a row made no "
                                                          "step progress", "restarts": 3, "requeue": False})]
    assert [mark_label(e) for e in ev[1:]] == [
        "hang: rank 1 on n2 made no progress for 31.2 s in section forward",
        "straggler: rank 3 on n1 is 2x slower (0.42 s a step vs 0.21 s; report)",
        "job failed: restart storm: 3 restarts in a row made no step progress (3 restarts; no requeue)"]
    out = timeline_html(ev)
    assert "hp-straggler-detected" in out and "#f9a825" in out and "hp-job-failed" in out and "#b71c1c" in out


def test_monitor_header_lists_the_excluded_nodes(tmp_path):
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobRecord, JobStore

    client = Client(JobStore(str(tmp_path / "store")))
    client.store.put(JobRecord(job_id="hdr-1", name="hdr", cluster="local", orchestrator="local", native_id="1",
                               job_dir=str(tmp_path / "job"), spec={"args": []}, status="running"))
    mon = JobMonitor("hdr-1", client=client, start=False)
    assert "excluded" not in mon.header.value
    mon._on_event(Event("node.excluded", "hdr-1", 1.0, "supervisor", 0, {"node": "n2", "reason": "faulted twice",
                                                                         "faults": 2, "excluded": ["n2"]}))
    mon._render()
    assert "excluded <span class='hp-excluded'>n2</span>" in mon.header.value and "faults 0" in mon.header.value


def test_monitor_header_names_the_nodes_and_the_faulted_ones_ranks_in_one_line(tmp_path):
    """Issue 27: per node, as the Lab's lanes: 2,048 ranks on 256 nodes are one line naming the
    node of rank 1337's fault and the rank, not a line per rank."""
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobRecord, JobStore

    client = Client(JobStore(str(tmp_path / "store")))
    client.store.put(JobRecord(job_id="hdr-2", name="hdr", cluster="local", orchestrator="local", native_id="1",
                               job_dir=str(tmp_path / "job"), spec={"args": []}, status="running"))
    mon = JobMonitor("hdr-2", client=client, start=False)
    assert "hp-nodes" not in mon.header.value  # no rank seen yet
    for r in range(2048):
        mon._on_event(Event("checkpoint.saved", "hdr-2", 1.0, f"rank-{r}", 0,
                            {"tier": "memory", "step": 4, "rank": r, "node": f"n{r // 8}"}))
    mon._on_event(Event("fault.detected", "hdr-2", 2.0, "agent-n167", 0,
                        {"rank": 1337, "node": "n167", "reason": "exception"}))
    mon._render()
    assert "<div class='hp-nodes'>256 nodes x 8 ranks; faults on n167 (rank 1337)</div>" in mon.header.value
    assert len(mon.header.value) < 1000


def test_kernel_spec_is_installed_and_loads_the_magics():
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"], capture_output=True,
                         text=True, check=True).stdout
    spec = json.loads(out)["kernelspecs"].get("hyperpod")
    assert spec, "kernel 'hyperpod' is not installed; run 'pip install -e .' (pyproject shared-data kernels/hyperpod)"
    assert spec["spec"]["display_name"] == "Python 3 (HyperPod)"
    with open(os.path.join(REPO, "kernels", "hyperpod", "kernel.json")) as f:
        ours = json.load(f)
    for key in ("argv", "display_name", "language"):
        assert spec["spec"][key] == ours[key], (key, spec["spec"][key], "reinstall: pip install -e .")
    assert "--IPKernelApp.extensions=hyperpod_lab" in ours["argv"]  # the magics load at start


def test_monitor_in_a_real_kernel_updates_widget_state(tmp_path):
    """nbclient runs a notebook in the "Python 3 (HyperPod)" kernel: no %load_ext needed;
    the monitor's widget state (sent over comms from its thread) ends at the last step."""
    (tmp_path / "train.py").write_text(SCRIPT)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"job = %hyperpod {submit_args()}"),
                nbformat.v4.new_code_cell("m = job.monitor(interval_s=0.2, status_interval_s=1.0)\nm"),
                nbformat.v4.new_code_cell("x = sum(range(10**6))  # another cell runs meanwhile\nm.wait(180).bar.value")]
    client = NotebookClient(nb, kernel_name="hyperpod", timeout=240, resources={"metadata": {"path": str(tmp_path)}},
                            store_widget_state=True)
    client.execute()
    outs = [o for c in nb.cells for o in c.outputs]
    errors = [o for o in outs if o.output_type == "error" or (o.output_type == "stream" and o.name == "stderr"
                                                             and "error:" in o.text)]
    assert not errors, errors
    view = nb.cells[1].outputs[0]["data"]["application/vnd.jupyter.widget-view+json"]
    assert nb.cells[2].outputs[-1]["data"]["text/plain"] == "12"
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [s["state"] for s in state.values() if s["model_name"] == "IntProgressModel"]
    assert bars and bars[0]["value"] == 12 and bars[0]["max"] == 12, bars
    assert view["model_id"] in state


QUIET_SCRIPT = """
import time
import hyperpod_lab.runtime as hp
with hp.init() as ctx:
    for step in range(4):
        time.sleep(0.1)
        ctx.step(step, loss=float(10 - step), total_steps=8)
    time.sleep(20)  # an evaluation, a slow data loader, a restart: no events for a while
    for step in range(4, 8):
        ctx.step(step, loss=float(10 - step), total_steps=8)
    ctx.finish(final_loss=2.0)
"""


def test_loss_plot_shows_steps_that_arrived_before_a_quiet_period(client, tmp_path):
    """Regression (issue 18): the plot said "loss: waiting for the first step" while the header
    showed the loss. Its redraw was throttled to once per plot_interval_s and only ever tried when
    new events arrived, so steps that arrived within plot_interval_s of the last redraw were not
    drawn until the next event came: here 20 s later (on a real job: a restart, an evaluation)."""
    from hyperpod_lab.spec import JobSpec

    (tmp_path / "quiet.py").write_text(QUIET_SCRIPT)
    rec = client.submit(JobSpec(script=str(tmp_path / "quiet.py"), name="quiet", cluster="local",
                                env={"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.01"}).validate())
    deadline = time.monotonic() + 60
    while sum(e.kind == "step" for e in client.event_reader(rec.job_id).poll()) < 4:
        assert time.monotonic() < deadline, "the job's first 4 steps did not arrive in 60 s"
        time.sleep(0.1)
    mon = JobMonitor(rec.job_id, client=client, interval_s=0.2, plot_interval_s=1.0)
    try:
        # due after plot_interval_s + interval_s (+ matplotlib's first import, seconds on a busy
        # machine); the job is in its 20 s quiet period all along
        until = time.monotonic() + 12
        while mon.plot_series is None and time.monotonic() < until:
            time.sleep(0.2)
        assert mon.progress.step == 3 and mon.progress.loss == 7.0
        assert "waiting for the first step" not in mon.plot_status.value, mon.plot_status.value
        assert mon.plot_series["step"] == [0, 1, 2, 3] and mon.plot_series["loss"] == [10.0, 9.0, 8.0, 7.0]
        assert bytes(mon.plot.value).startswith(b"\x89PNG") and "loss 7 at step 3" in mon.plot_status.value
    finally:
        mon.stop()
    client.cancel(rec.job_id)


def test_timeline_collapses_checkpoints_per_tier_and_shows_a_fault_and_its_recovery_once(client):
    """A real 2-rank job (examples/train_lm.py, gloo) with a memory checkpoint every step on both
    ranks and a persistent one every 5; rank 1 is SIGKILLed after the first checkpoint and the
    job recovers from memory. The monitor's timeline (hyperpod_lab.fold.aggregate's) has one line per
    run of checkpoints of a tier (over both ranks), not one per checkpoint per rank; the fault
    (rank 1; rank 0's SIGTERM by torchrun is no second fault line), the restore of both ranks
    and the recovery are one line each. The monitor shows the aggregate's timeline as it comes
    (the rules themselves: tests/fold/test_aggregate.py)."""
    from hyperpod_lab import cli

    job = cli.run(["submit", os.path.join(REPO, "examples", "train_lm.py"), "--cluster", "local",
                   "--procs-per-node", "2", "--checkpoint-memory-every", "1", "--checkpoint-every", "5",
                   "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.05", "--name", "tl",
                   "--", "--steps", "24", "--step-sleep", "0.2", "--d-model", "64", "--n-layers", "1"], client=client)
    mon = JobMonitor(job, client=client, interval_s=0.3, plot_interval_s=1.0)
    cli.run(["inject-fault", job, "--rank", "1", "--after-checkpoint"], client=client)
    mon.wait(300)
    assert mon.state == "completed", (mon.state, client.logs(job)[-2000:])
    saved = [e for e in mon.events if e.kind == "checkpoint.saved"]
    by_tier = {t: [e for e in saved if e.data["tier"] == t] for t in ("memory", "persistent")}
    # both ranks run on this one node: its lowest rank writes one memory event a step for both
    # (runtime/checkpoint/node_saves.py), which the timeline spreads over their lanes
    assert len(by_tier["memory"]) >= 20 and {e.writer for e in by_tier["memory"]} == {"rank-0"}
    assert all(e.data["ranks"] == [0, 1] and len(e.data["rank_bytes"]) == 2 for e in by_tier["memory"])
    # rank 1 (the root cause); rank 0, which torchrun then stopped, is in its stopped_ranks (one
    # event for the node's worker group: hyperpod_lab.node.launch), or has its own event when its
    # collective failed first (an exit code, not torchrun's SIGTERM: not the root cause)
    faults = [e for e in mon.events if e.kind == "fault.detected"]
    assert faults[0].data["rank"] == 1 and faults[0].data["root_cause"] is True, [e.data for e in faults]
    stopped = faults[0].data.get("stopped_ranks")
    assert (stopped == [0] and len(faults) == 1) or (
        stopped is None and [(e.data["rank"], e.data["root_cause"]) for e in faults[1:]] == [(0, False)]), \
        [e.data for e in faults]

    entries = mon.aggregate.timeline()
    spans = [e for e in entries if e["kind"] == "checkpoint"]
    for tier in ("memory", "persistent"):
        lines = [e for e in spans if e["tier"] == tier]
        assert 1 <= len(lines) <= 2, ([{k: e[k] for k in ("t", "t1", "step0", "step1", "count", "ranks")}
                                       for e in lines], [(round(e.time, 3), e.writer, e.data["step"])
                                                         for e in by_tier[tier]][:12])  # one run before the fault, one after
        assert sum(e["count"] for e in lines) >= len(by_tier[tier]) // (2 if tier == "memory" else 1)
    assert all(e["ranks"] == [0, 1] for e in spans if e["tier"] == "memory"), spans
    html_ = mon.timeline.value
    marks = html_.split("<span class='hp-mark ")[1:]
    assert len(marks) == len(entries) <= 10, marks
    assert sum(m.startswith("hp-checkpoint-saved hp-span") for m in marks) == len(spans)
    assert any("checkpoint memory step 0" in m or "checkpoint memory steps 0-" in m for m in marks), marks
    fault_marks = [m for m in marks if m.startswith("hp-fault-detected")]
    assert len(fault_marks) == 1 and "rank 1 on" in fault_marks[0] and "SIGKILL" in fault_marks[0], fault_marks
    assert stopped is None or "its agent stopped rank 0" in fault_marks[0], fault_marks
    recovered = [m for m in marks if m.startswith("hp-recovery-completed")]
    assert len(recovered) == 1 and "recovered in" in recovered[0] and "from memory" in recovered[0], recovered
    restored = [m for m in marks if m.startswith("hp-checkpoint-restored")]
    assert len(restored) == 1 and "ranks 0, 1" in restored[0], restored
    assert sum(m.startswith("hp-finished") for m in marks) == 1


def test_plot_status_names_steps_without_a_finite_loss(tmp_path):
    """Steps whose loss was NaN/inf arrive with loss null (runtime/context.py _json_safe): the
    plot says so instead of waiting for a first step; the first finite loss is then drawn."""
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobRecord, JobStore

    client = Client(JobStore(str(tmp_path / "store")))
    client.store.put(JobRecord(job_id="nan-1", name="nan", cluster="local", orchestrator="local", native_id="1",
                               job_dir=str(tmp_path / "job"), spec={"args": []}, status="running"))
    mon = JobMonitor("nan-1", client=client, start=False)
    assert "waiting for the first step" in mon.plot_status.value and mon.plot_series is None
    for s in range(3):
        mon._on_event(Event("step", "nan-1", 10.0 + s, "rank-0", s, {"step": s, "loss": None, "steps_per_s": 2.0}))
    mon._render(force_plot=True)
    assert "without a finite loss" in mon.plot_status.value and mon.plot_series["step"] == [0, 1, 2]
    mon._on_event(Event("step", "nan-1", 13.0, "rank-0", 3, {"step": 3, "loss": 4.5, "steps_per_s": 2.0}))
    mon._render(force_plot=True)
    assert "loss 4.5 at step 3" in mon.plot_status.value and mon.plot_series["loss"][-1] == 4.5
    assert bytes(mon.plot.value).startswith(b"\x89PNG")


def test_timeline_html_shows_the_aggregates_timeline_as_it_comes():
    """The monitor adds nothing to JobAggregate.timeline() and drops nothing (the one-line rules:
    tests/fold/test_aggregate.py): one chip per entry, in its order, with its label; the fault
    another rank's caused (root_cause false) is not there, both ranks' step-0 checkpoint (4 ms
    apart) is one chip, a failed node's checks are red and a passed node's teal."""
    from hyperpod_lab.fold.aggregate import JobAggregate

    ok = {"status": "passed", "detail": "", "seconds": 0.1}
    ev = [Event("health.checked", "j", 99.0, "health-n1", 0, {"node": "n1", "ok": True, "seconds": 1.0,
                                                               "checks": {"gpu": ok}}),
          Event("health.checked", "j", 99.5, "health-n2", 0, {"node": "n2", "ok": False, "seconds": 1.0,
                                                               "checks": {"gpu": {"status": "failed"}}}),
          Event("checkpoint.saved", "j", 100.000, "rank-0", 0, {"step": 0, "tier": "memory"}),
          Event("checkpoint.saved", "j", 100.004, "rank-1", 0, {"step": 0, "tier": "memory"}),
          Event("fault.detected", "j", 101.0, "agent-n1", 0, {"rank": 1, "node": "n1", "signal": "SIGKILL",
                                                             "root_cause": True}),
          Event("fault.detected", "j", 101.0, "agent-n1", 1, {"rank": 0, "node": "n1", "signal": "SIGTERM",
                                                             "root_cause": False})]
    for r in (0, 1):
        ev.append(Event("checkpoint.restored", "j", 105.0 + r, f"rank-{r}", 1, {"tier": "memory", "step": 0, "rank": r}))
    agg = JobAggregate()
    for e in ev:
        agg.fold(e)
    out = timeline_html(aggregate=agg)
    chips = out.split("<span class='hp-mark ")[1:]
    assert [c.split(">", 1)[1].split("</span>")[0].split(" ", 1)[1] for c in chips] == [
        html.escape(e["label"]) for e in agg.timeline()] == [
        "health checks passed on n1 (1 checks, 1 s)", "health checks failed on n2: gpu (1 s)",
        "checkpoint memory step 0 (x1) · ranks 0, 1", "fault: rank 1 on n1 (SIGKILL)",
        "restored memory step 0 · ranks 0, 1"]
    assert "#00796b" in chips[0] and "#c62828" in chips[1]
    assert timeline_html(ev) == out  # from the events: the same fold
