"""The same JobSpec on the built-in 'local' cluster: torchrun subprocesses on this machine."""

import os
import time

from hyperpod_lab import cli
from hyperpod_lab.submit.jobs import JobStatus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")


def test_local_two_processes_with_injected_fault(client):
    job_id = cli.run(["submit", EXAMPLE, "--cluster", "local", "--procs-per-node", "2", "--checkpoint-every", "5",
                      "--name", "proto", "--", "--steps", "25", "--step-sleep", "0.05"], client=client)
    reader = client.event_reader(job_id)
    events, injected, deadline = [], False, time.monotonic() + 240
    while time.monotonic() < deadline and not any(e.kind == "finished" for e in events):
        events += reader.poll()
        if not injected and any(e.kind == "checkpoint.saved" for e in events):
            cli.run(["inject-fault", job_id, "--rank", "0"], client=client)
            injected = True
        time.sleep(0.2)
    kinds = [e.kind for e in events]
    assert injected and "fault.detected" in kinds and "recovery.completed" in kinds, kinds
    rec = client.wait(job_id, timeout_s=60)
    assert rec.state == JobStatus.COMPLETED, client.logs(job_id)
    assert [e for e in events if e.kind == "finished"][0].data["status"] == "succeeded"


def test_dry_run_renders_and_submits_nothing(client, capsys):
    cli.run(["submit", EXAMPLE, "--cluster", "local", "--procs-per-node", "2", "--dry-run", "--", "--steps", "3"],
            client=client)
    out = capsys.readouterr().out
    assert "hyperpod_lab.node.launch" in out and "--nproc-per-node=2" in out and "--steps 3" in out
    assert client.store.list() == []
