"""The CLI's human output (hyperpod_lab/cli/render.py): one line per event of every kind, the
200-character limit, the progress bar on a terminal (rich, a real pseudo-terminal and a forced
one) and plain lines elsewhere, the summary. Real Event objects, a real rich Console."""

from __future__ import annotations

import io
import json
import os
import re
import time

import pytest
from rich.console import Console

from hyperpod_lab.cli.render import MAX_LINE, EventView, event_line, event_text, make_console, summary_rows
from hyperpod_lab.events import Event, EventKind

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
T0 = 1_795_000_000.0
HEALTH_CHECKS = {
    "clock": {"status": "passed", "detail": "skew +6.7 ms against the shared storage (limit 2 s)", "seconds": 2e-05,
              "skew_s": 0.0067, "max_skew_s": 2.0},
    "gpu": {"status": "skipped", "detail": "no GPU requested", "seconds": 2e-06},
    "shm": {"status": "passed", "detail": "...", "seconds": 0.003, "free_bytes": int(23.5 * 2**30),
            "needed_bytes": 64 * 2**20, "held_bytes": 0, "path": "/dev/shm/hyperpod-lab", "budget_from": "floor"},
    "storage": {"status": "passed", "detail": "...", "seconds": 0.006, "write_s": 0.0019, "read_s": 0.0004,
                "bytes": 2**20, "path": "/fsx/jobs/j/health/n1"},
    "versions": {"status": "skipped", "detail": "no version expected", "seconds": 1.6,
                 "versions": {"hyperpod_lab": "0.1.0", "torch": "2.13.0", "torch_cuda": None, "python": "3.11.7"}},
}

# (kind, data, the text event_line shows after the time and the kind): one case per EventKind
CASES = [
    ("submitted", {"cluster": "local", "native_id": "28810", "name": "proto", "nodes": 2, "procs_per_node": 4,
                   "world_size": 8}, "proto to local (job 28810): 2 nodes x 4 = 8 ranks"),
    ("started", {"world_size": 2, "nodes": 1, "script": "/work/examples/train_lm.py", "restart_count": 0},
     "2 ranks on 1 node: train_lm.py"),
    ("step", {"step": 11, "loss": 3.354, "steps_per_s": 4.111, "tokens_per_s": 11320.4, "lr": 0.002102},
     "step 11/25, loss 3.354, 4.11 steps/s, lr 0.002102, 11320 tokens/s"),
    ("checkpoint.saved", {"tier": "memory", "step": 5, "bytes": 22442752, "blocked_s": 0.0066, "total_s": 0.0082,
                          "path": "/dev/shm/x/slot-0.bin", "rank": 1, "node": "n1", "memory_bytes": 44892160},
     "memory step 5 (rank 1 on n1): 21.4 MiB in 8.2 ms (6.6 ms blocking)"),
    ("checkpoint.restored", {"tier": "peer", "step": 4, "bytes": 2**20, "seconds": 0.25, "path": "/p", "rank": 2,
                             "node": "n2", "from_rank": 0, "from_node": "n1"},
     "peer step 4 (rank 2 on n2, from rank 0 on n1): 1.0 MiB in 250.0 ms"),
    ("checkpoint.corrupt", {"tier": "persistent", "step": 9, "path": "/fsx/c/step-9", "reason": "checksum mismatch"},
     "persistent step 9 skipped: checksum mismatch (/fsx/c/step-9)"),
    ("checkpoint.failed", {"tier": "s3", "step": 20, "reason": "SlowDown", "attempt": 2, "will_retry": True,
                           "retry_in_s": 4.0, "path": "s3://b/c"},
     "s3 step 20 attempt 2 failed: SlowDown, retry in 4.00 s"),
    ("fault.detected", {"rank": 0, "local_rank": 0, "node": "n1", "exitcode": -9, "signal": "SIGKILL",
                        "reason": "Signal 9 (SIGKILL) received by PID 28834", "pid": 28834, "root_cause": True},
     "rank 0 on n1: Signal 9 (SIGKILL) received by PID 28834"),
    ("recovery.started", {"restart_count": 1, "reason": "local worker failed", "node": "n1"},
     "restart 1 on n1: local worker failed"),
    ("recovery.completed", {"restored_step": 4, "restart_count": 1, "downtime_s": 2.465, "restored_from": "memory"},
     "restart 1: step 4 restored from memory, downtime 2.46 s"),
    ("recovery.fallback", {"replica_group": 1, "step": 10, "tier": "persistent", "reason": "no live replica held it"},
     "replica group 1: no live replica, restored persistent step 10: no live replica held it"),
    ("elastic.scaled", {"step": 30, "old_world_size": 4, "new_world_size": 2, "old_replicas": 2, "new_replicas": 1,
                        "micro_batch_size": 8, "old_accumulation_steps": 1, "accumulation_steps": 2,
                        "global_batch_size": 32, "effective_batch": 32, "old_lr": 0.001, "lr": 0.0007071,
                        "lr_rule": "sqrt"},
     "at step 30, ranks 4 -> 2, replicas 2 -> 1, accumulation 1 -> 2, global batch 32, lr 0.001 -> 0.0007071 (sqrt)"),
    ("health.checked", {"node": "n1", "run_id": "run-1", "ok": True, "checks": HEALTH_CHECKS, "seconds": 1.62},
     "n1 passed: gpu skipped, shm 23.5 GiB free, storage 1.9 ms, clock +6.7 ms"),
    ("health.failed", {"node": "n2", "run_id": "run-1", "check": "shm", "detail": "only 1.0 MiB free"},
     "n2 shm failed: only 1.0 MiB free"),
    ("node.excluded", {"node": "n2", "reason": "faulted twice", "faults": 2, "excluded": ["n2"]},
     "n2: faulted twice (2 faults); excluded now: n2"),
    ("straggler.detected", {"rank": 3, "node": "n2", "score": 1.83, "step_s": 0.45, "median_step_s": 0.25,
                            "compute_s": 0.4, "median_compute_s": 0.2, "wait_s": 0.05, "window": 16, "step": 40,
                            "action": "report", "threshold": 1.5},
     "rank 3 on n2 1.83x slower than the others (step 450.0 ms vs 250.0 ms) at step 40: report"),
    ("job.failed", {"reason": "restart storm: 3 restarts in a row made no step progress", "restarts": 3,
                    "fault": "rank 0 on n1: RuntimeError", "requeue": False, "criterion": "no progress",
                    "storm_restarts": 3, "exit_code": 3},
     "after 3 restarts, no progress, exit 3, no requeue: restart storm: 3 restarts in a row made no step progress"),
    ("finished", {"status": "succeeded", "steps": 25, "final_loss": 3.133, "eval_loss": 2.89, "exit_code": 0},
     "succeeded: 25 steps, final loss 3.133, eval loss 2.89"),
]


def _ev(kind: str, data: dict, t: float = T0, writer: str = "rank-0", seq: int = 0) -> Event:
    return Event(kind=kind, job_id="j-1", time=t, writer=writer, seq=seq, data=data)


NODE_SAVES = [  # a node's one memory and one peer event (8 ranks a node: runtime/checkpoint/node_saves.py)
    ("checkpoint.saved", {"tier": "memory", "step": 5, "bytes": 2**21, "blocked_s": 0.0066, "total_s": 0.0082,
                          "ranks": [8, 9], "rank_bytes": [2**20, 2**20], "node": "n2", "memory_bytes": 2**23},
     "memory step 5 (ranks 8, 9 on n2): 2.0 MiB in 8.2 ms (6.6 ms blocking)"),
    ("checkpoint.saved", {"tier": "peer", "step": 5, "bytes": 2**21, "blocked_s": 0.0, "total_s": 0.0082,
                          "of_ranks": [0, 1], "rank_bytes": [2**20, 2**20], "node": "n2", "memory_bytes": 2**23},
     "peer step 5 (n2, copies of ranks 0, 1): 2.0 MiB in 8.2 ms (0.0 ms blocking)"),
]


@pytest.mark.parametrize("kind,data,text", NODE_SAVES, ids=["memory", "peer"])
def test_a_nodes_one_checkpoint_event_names_its_ranks(kind, data, text):
    assert event_text(_ev(kind, data)) == text


def test_the_cases_cover_every_event_kind():
    assert sorted(k for k, _, _ in CASES) == sorted(k.value for k in EventKind)


@pytest.mark.parametrize("kind,data,text", CASES, ids=[c[0] for c in CASES])
def test_each_kind_is_one_readable_line(kind, data, text):
    ev = _ev(kind, data)
    line = event_line(ev, total_steps=25)
    t = time.strftime("%H:%M:%S", time.localtime(T0))
    assert line == f"{t} {kind:<19} {text}", line
    assert len(line) <= MAX_LINE and "\n" not in line


def test_special_fault_reasons_hang_and_node_down():
    hang = _ev("fault.detected", {"reason": "hang", "rank": 1, "local_rank": 1, "node": "n2", "stalled_s": 35.2,
                                  "section": "allreduce", "step": 12, "hang_timeout_s": 30.0,
                                  "timeout_source": "derived", "stacks": "py-spy"})
    assert event_text(hang) == "rank 1 on n2 hung: no progress for 35.2 s in allreduce at step 12 (timeout 30.0 s, derived)"
    down = _ev("fault.detected", {"reason": "node down", "node": "n2", "rank": [2, 3], "slurm_state": "DOWN",
                                  "detected_by": "supervisor"}, writer="supervisor")
    assert event_text(down) == "node n2 down (Slurm DOWN), ranks 2, 3"
    replica = _ev("checkpoint.restored", {"tier": "replica", "step": 7, "replica_group": 1, "node": "n3"})
    assert event_text(replica) == "replica step 7: replica group 1, on n3 healed from a live peer"
    ckless = _ev("recovery.completed", {"mode": "checkpointless", "resumed_step": 8, "replicas": 1,
                                        "lost_replica_groups": [1], "downtime_s": 1.5, "restored_from": "none"})
    assert event_text(ckless) == "checkpointless: step 8 redone with 1 replica, lost replica groups 1, downtime 1.50 s"


def test_the_eks_operators_reports_and_a_client_written_end():
    src = {"source": "operator"}
    fault = _ev("fault.detected", {"rank": None, "ranks": [1, 2], "pods": ["p-1"], "restart_type": "job", "node": None,
                                   "reason": "the operator restarted the job (job), restart 1", **src}, writer="operator")
    assert event_text(fault) == "ranks 1, 2: the operator restarted the job (job), restart 1 (operator)"
    back = _ev("recovery.completed", {"restart_count": 1, "downtime_s": 12.5, "restored_step": None,
                                      "restored_from": None, **src}, writer="operator")
    assert event_text(back) == "restart 1: running again, downtime 12.5 s (operator)"
    scaled = _ev("elastic.scaled", {"old_nodes": 4, "new_nodes": 2, "old_world_size": 32, "new_world_size": 16, **src})
    assert event_text(scaled) == "nodes 4 -> 2, ranks 32 -> 16 (operator)"
    end = _ev("finished", {"status": "failed", "exit_code": 1, "reason": "NodeFail"}, writer="client")
    assert event_text(end) == "failed: exit 1, NodeFail"


def test_failed_health_check_comes_first_with_its_detail():
    checks = dict(HEALTH_CHECKS, shm={"status": "failed", "detail": "/dev/shm has 1.0 MiB free, needs 64.0 MiB",
                                      "seconds": 0.01, "free_bytes": 2**20})
    line = event_text(_ev("health.checked", {"node": "n2", "ok": False, "checks": checks}))
    assert line == ("n2 FAILED: shm FAILED: /dev/shm has 1.0 MiB free, needs 64.0 MiB, gpu skipped, storage 1.9 ms, "
                    "clock +6.7 ms")


def test_long_and_hostile_fields_stay_one_line_of_200():
    reason = "Traceback:\n  File \x1b[31mx.py\x1b[0m\r\n\u2028" + "RuntimeError: " + "y" * 5000
    ev = _ev("fault.detected", {"rank": 0, "node": "n1", "reason": reason})
    line = event_line(ev)
    assert len(line) == MAX_LINE and line.endswith("…")
    assert not any(ord(c) < 32 or c in "\x7f\u2028" for c in line), repr(line[:120])
    # a script's own metric with a control character in its name
    step = event_line(_ev("step", {"step": 1, "loss": 1.0, "bad\x1b]0;title\x07name": 2.0}))
    assert "\x1b" not in step and "\x07" not in step


def test_unexpected_data_falls_back_to_key_value():
    # a step whose loss is text (another writer), a health check with no checks: still one line, no error
    assert event_text(_ev("step", {"step": 3, "loss": "nan", "steps_per_s": "fast"})) == "step 3, loss nan"
    assert event_text(_ev("checkpoint.saved", {"tier": "s3", "attempts": "three"})) == "attempts=three tier=s3"
    assert event_text(_ev("health.checked", {"node": "n1", "ok": True})) == "n1 passed"
    assert event_text(_ev("recovery.completed", {})) == "step ? restored from ?"


def _job_events() -> list[Event]:
    """A restart job's events: health check, start, steps, a fault and its recovery, checkpoints, the end."""
    evs = [_ev("submitted", {"cluster": "local", "name": "proto", "nodes": 1, "procs_per_node": 2, "world_size": 2},
               T0, "client"),
           _ev("health.checked", {"node": "n1", "run_id": "r", "ok": True, "checks": HEALTH_CHECKS, "seconds": 1.5},
               T0 + 2, "health-n1"),
           _ev("started", {"world_size": 2, "nodes": 1, "script": "train.py"}, T0 + 3)]
    t = T0 + 3
    for s in range(0, 12, 2):
        t += 0.5
        evs.append(_ev("step", {"step": s, "loss": 5.0 - s / 10, "steps_per_s": 4.0 if s else None}, t, seq=len(evs)))
    evs += [_ev("checkpoint.saved", {"tier": "persistent", "step": 9, "bytes": 2**24, "blocked_s": 0.01,
                                     "total_s": 0.1}, t + 0.1, seq=len(evs)),
            _ev("fault.detected", {"rank": 0, "node": "n1", "reason": "Signal 9 (SIGKILL)"}, t + 0.3, "agent-n1"),
            _ev("recovery.started", {"restart_count": 1, "reason": "local worker failed", "node": "n1"}, t + 0.4,
                "agent-n1", 1),
            _ev("checkpoint.restored", {"tier": "persistent", "step": 9, "bytes": 2**24, "seconds": 0.2}, t + 2,
                seq=100),
            _ev("recovery.completed", {"restored_step": 9, "restart_count": 1, "downtime_s": 2.0,
                                       "restored_from": "persistent"}, t + 2.3, seq=101)]
    t += 2.3
    for s in range(10, 25, 2):
        t += 0.5
        evs.append(_ev("step", {"step": s, "loss": 4.0 - s / 20, "steps_per_s": 4.0}, t, seq=200 + s))
    evs.append(_ev("finished", {"status": "succeeded", "steps": 25, "final_loss": 2.8, "eval_loss": 2.7}, t + 0.2,
                   seq=300))
    return evs


def test_plain_follow_prints_step_total_eta_and_a_summary():
    lines: list[str] = []
    with EventView(lines.append, console=None, spec={"args": ["--steps", "25"]}) as view:
        for ev in _job_events():
            view.show(ev)
    view.summary()
    steps = [ln for ln in lines if " step " in ln[8:30]]
    assert steps[0].endswith("step 0/25, loss 5")  # no rate yet: no ETA
    # step 2 done (3 of 25) at 4 steps/s: 22 steps left, 5.5 s
    assert steps[1].endswith("step 2/25, loss 4.8, 4 steps/s, ETA 0:00:06"), steps[1]
    assert all(len(ln) <= MAX_LINE for ln in lines)
    i = lines.index("summary: succeeded")
    summary = lines[i + 1:]
    assert summary[0].split() == ["steps", "25", "of", "25", "in", "12.5", "s"], summary
    rows = {ln.split()[0]: " ".join(ln.split()[1:]) for ln in summary}
    assert rows["faults"] == "1" and rows["recoveries"] == "1, downtime 2.00 s"  # detection to recovery.completed
    assert rows["checkpoints"] == "1 saved (persistent 1), 1 restored"
    assert rows["pre-flight"] == "1 run, 1.50 s"
    assert rows["goodput"].endswith(")") and float(rows["goodput"].split()[0]) > 0


def test_json_lines_are_the_events_and_nothing_else():
    lines: list[str] = []
    evs = _job_events()
    with EventView(lines.append, console=Console(file=io.StringIO(), force_terminal=True), json_lines=True) as view:
        for ev in evs:
            view.show(ev)
    assert view.summary() == []
    assert [Event.from_json(ln) for ln in lines] == evs
    assert all(json.loads(ln)["v"] == 1 for ln in lines)


def test_terminal_follow_draws_a_progress_bar_and_a_summary_table():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=250, color_system="standard")
    lines: list[str] = []
    with EventView(lines.append, console=console, spec={"args": ["--steps", "25"]}) as view:
        for ev in _job_events():
            view.show(ev)
    rows = dict(view.summary())
    assert lines == []  # everything went through the console
    raw = buf.getvalue()
    assert "\x1b[" in raw  # styled: a terminal's output
    text = ANSI.sub("", raw).replace("\r", "\n")
    # the bar: step/total, steps/s, ETA; at the end 25 of 25 done
    assert re.search(r"━+ 25/25 steps • 4 steps/s • ETA 0:00:00", text), text[-2000:]
    assert re.search(r"━+ 3/25 steps • 4 steps/s • ETA 0:00:06", text), text[-4000:]
    # event lines above it, but no line per step (the bar shows them)
    assert "fault.detected      rank 0 on n1: Signal 9 (SIGKILL)" in text
    assert "health.checked      n1 passed: gpu skipped, shm 23.5 GiB free, storage 1.9 ms, clock +6.7 ms" in text
    assert not re.search(r"\d\d:\d\d:\d\d step ", text)
    # the summary table
    assert "┃" in text or "│" in text
    assert re.search(r"│ recoveries\s+│ 1, downtime 2.00 s\s+│", text), text[-2000:]
    assert rows["faults"] == "1" and rows["status"] == "succeeded"


def test_console_only_on_a_terminal():
    assert make_console(io.StringIO()) is None
    given = Console(file=io.StringIO(), force_terminal=True)
    assert make_console(io.StringIO(), given) is given
    master, slave = os.openpty()  # a real pseudo-terminal
    try:
        with open(slave, "w", closefd=False) as tty:
            console = make_console(tty)
            assert console is not None and console.is_terminal and not console.is_jupyter
    finally:
        os.close(master)
        os.close(slave)


def test_summary_without_steps_has_no_goodput():
    rows = dict(summary_rows([_ev("submitted", {"cluster": "local", "name": "x"}, writer="client")]))
    assert rows["status"] == "no 'finished' event yet" and "goodput" not in rows


def test_summary_names_the_nodes_and_the_faulted_ones_ranks():
    """Issue 27: per node, as the Lab's lanes: one row, whatever the rank count; a node-down
    fault names the node's ranks."""
    evs = [_ev("submitted", {"cluster": "c", "nodes": 64, "procs_per_node": 8, "world_size": 512}, writer="client")]
    evs += [_ev("checkpoint.saved", {"tier": "memory", "step": 4, "rank": r, "node": f"n{r // 8}"}, 1.0,
                writer=f"rank-{r}") for r in range(512)]
    assert dict(summary_rows(evs))["nodes"] == "64 nodes x 8 ranks; no faults"
    evs.append(_ev("fault.detected", {"rank": 93, "node": "n11", "reason": "exception"}, 2.0, writer="agent-n11"))
    evs.append(_ev("fault.detected", {"reason": "node down", "node": "n40", "rank": list(range(320, 328))}, 3.0,
                   writer="supervisor"))
    assert dict(summary_rows(evs))["nodes"] == "64 nodes x 8 ranks; faults on n11 (rank 93), n40 (ranks 320-327)"
