"""``hyperpod-lab submit --follow`` and ``events`` on a real job: the example script on the
built-in 'local' cluster (torchrun, two real torch processes), rank 0 SIGKILLed after its first
checkpoint, and a real pre-flight health check of this machine (``python -m
hyperpod_lab.node.health``, as node n1) writing its ``health.checked`` into the job's events.

What a person sees: no line over 200 characters without ``--json``, the health check as
``n1 passed: gpu skipped, shm 23.5 GiB free, storage 1.9 ms, clock +6.7 ms``, a progress bar and
a summary table on a terminal (a rich Console forced to be one), plain lines elsewhere; with
``--json`` each line is a schema-v1 event.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time

from rich.console import Console

from hyperpod_lab import cli
from hyperpod_lab.cli.render import MAX_LINE
from hyperpod_lab.events import Event
from hyperpod_lab.jobdir import ENV_JOB_DIR, ENV_JOB_ID, ENV_SHM_DIR, ENV_SPEC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STEPS = 30
HEALTH_LINE = re.compile(r"^\d\d:\d\d:\d\d health\.checked +n1 passed: gpu skipped, shm \d+\.\d [KMGT]iB free, "
                         r"storage \d+\.\d+ m?s, clock [+-]\d+\.\d ms$")


def _health_check(job_dir: str, job_id: str, shm_root: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPOD_LAB_HEALTH_")}
    env.pop(ENV_SPEC, None)
    env.update({ENV_JOB_DIR: job_dir, ENV_JOB_ID: job_id, ENV_SHM_DIR: shm_root, "SLURMD_NODENAME": "n1"})
    return subprocess.Popen([sys.executable, "-m", "hyperpod_lab.node.health", "--node-run-id", "run-1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(argv: list[str], client, console=None) -> list[str]:
    out = io.StringIO()
    cli.run(argv, out=out, client=client, console=console)
    return out.getvalue().splitlines()


def test_follow_and_events_of_a_real_job_with_a_fault_and_a_health_check(client, tmp_path):
    term = io.StringIO()
    console = Console(file=term, force_terminal=True, width=250)
    result: dict = {}

    def submit_and_follow() -> None:
        try:
            result["job"] = cli.run(["submit", EXAMPLE, "--cluster", "local", "--procs-per-node", "2",
                                     "--checkpoint-every", "5", "--checkpoint-memory-every", "2", "--name", "clirender",
                                     "--follow", "--", "--steps", str(STEPS), "--step-sleep", "0.05"],
                                    out=term, client=client, console=console)
        except BaseException as e:  # reported by the assertion below
            result["error"] = e

    follower = threading.Thread(target=submit_and_follow, daemon=True)
    follower.start()
    deadline = time.monotonic() + 60
    while not client.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
    [rec] = client.jobs()
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    health = _health_check(rec.job_dir, rec.job_id, str(shm))
    reader, injected, deadline = client.event_reader(rec.job_id), False, time.monotonic() + 240
    while not injected and time.monotonic() < deadline:
        if any(e.kind == "checkpoint.saved" for e in reader.poll()):
            cli.run(["inject-fault", rec.job_id, "--rank", "0"], out=io.StringIO(), client=client)
            injected = True
        time.sleep(0.2)
    assert health.wait(timeout=120) == 0, health.communicate()[0]
    follower.join(timeout=240)
    assert injected and not follower.is_alive() and "error" not in result, (result, term.getvalue()[-3000:])
    assert result["job"] == rec.job_id
    assert client.wait(rec.job_id, timeout_s=60).status == "completed", client.logs(rec.job_id)

    # submit --follow on a terminal: event lines above a bar (step/total, steps/s, ETA), a summary table
    shown = ANSI.sub("", term.getvalue()).replace("\r", "\n")
    assert re.search(rf"━+ {STEPS}/{STEPS} steps • [\d.]+ steps/s • ETA 0:00:00", shown), shown[-3000:]
    assert re.search(r"fault\.detected +rank 0 on \S+: .*SIGKILL", shown), shown[-3000:]
    assert [ln for ln in shown.splitlines() if HEALTH_LINE.match(ln)], shown[-3000:]
    assert not re.search(r"\d\d:\d\d:\d\d step ", shown)  # steps move the bar, not a line each
    assert re.search(r"│ faults\s+│ 1[ (]", shown) and re.search(r"│ recoveries\s+│ 1, downtime [\d.]+ m?s", shown), \
        shown[-3000:]
    assert re.search(r"│ goodput\s+│ [\d.]+ %", shown), shown[-3000:]

    # events JOB: one line per event, none over 200 characters; the real health check's line
    events = client.event_reader(rec.job_id).poll()
    lines = _run(["events", rec.job_id], client)
    assert len(lines) == len(events) and all(len(ln) <= MAX_LINE for ln in lines), max(lines, key=len)
    [checked] = [e for e in events if e.kind == "health.checked"]
    assert len(checked.describe()) > MAX_LINE  # the old output: the whole dict on one line
    [health_line] = [ln for ln in lines if " health.checked " in ln]
    assert HEALTH_LINE.match(health_line), health_line
    free = checked.data["checks"]["shm"]["free_bytes"]
    assert f"shm {free / 2**30:.1f} GiB free" in health_line or free < 2**30, (health_line, free)
    kinds_shown = {ln.split()[1] for ln in lines}
    assert {"submitted", "started", "step", "checkpoint.saved", "fault.detected", "recovery.started",
            "checkpoint.restored", "recovery.completed", "health.checked", "finished"} <= kinds_shown, kinds_shown
    assert any(re.search(rf" step +step \d+/{STEPS}, loss ", ln) for ln in lines)

    # events JOB --json: the events themselves, one schema-v1 JSON line each
    json_lines = _run(["events", rec.job_id, "--json"], client)
    assert [Event.from_json(ln) for ln in json_lines] == events
    assert all(json.loads(ln)["v"] == 1 for ln in json_lines)

    # events JOB --follow, not a terminal: plain lines, then 'summary: ...' rows
    plain = _run(["events", rec.job_id, "--follow", "--timeout", "60"], client)
    assert all(len(ln) <= MAX_LINE and "\x1b" not in ln for ln in plain), max(plain, key=len)
    i = plain.index("summary: succeeded")
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in plain[i + 1:]}
    assert rows["steps"].startswith(f"{STEPS} of {STEPS} in "), rows
    assert rows["faults"].split()[0] == "1" and rows["recoveries"].startswith("1, downtime "), rows
    assert rows["pre-flight"].startswith("1 run, "), rows
    assert len(plain[:i]) == len(events)
