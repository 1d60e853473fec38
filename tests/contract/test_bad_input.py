"""Bad input gets a clear error and leaves nothing half-done (no job record, no staged files)."""

import os
import subprocess
import sys
import time

import pytest

from hyperpod_lab import cli
from hyperpod_lab.errors import HyperPodLabError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")


def _jobs_dirs(profile):
    from hyperpod_lab.jobdir import user_jobs_root
    from hyperpod_lab.schedulers.remote import LocalRemote

    root = user_jobs_root(profile.shared_root, profile.user or LocalRemote().user_name())
    return set(os.listdir(root)) if os.path.isdir(root) else set()


@pytest.mark.parametrize("argv, words", [
    (["submit", EXAMPLE, "--cluster", "nope"], "unknown cluster 'nope'; known clusters:"),
    (["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "0"], "nodes: must be a whole number >= 1"),
    (["submit", EXAMPLE, "--cluster", "local-slurm", "--elastic", "4:2"], "write --elastic 2:4"),
    (["submit", "no/such/script.py", "--cluster", "local-slurm"], "no/such/script.py does not exist"),
    (["submit", EXAMPLE, "--cluster", "local-slurm", "--name", "a\nb"], "name: must be at most 128 printable"),
    (["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "two"], "expected a whole number"),
    (["status", "no-such-job"], "unknown job 'no-such-job'"),
])
def test_bad_submissions_fail_clearly_and_change_nothing(argv, words, dev_cluster, client):
    before = _jobs_dirs(dev_cluster)
    with pytest.raises(HyperPodLabError) as e:
        cli.run(argv, client=client)
    assert words in str(e.value)
    assert client.store.list() == []
    assert _jobs_dirs(dev_cluster) == before


def test_cli_exit_code_and_message_for_unknown_cluster(dev_cluster):
    p = subprocess.run([sys.executable, "-m", "hyperpod_lab.cli", "submit", EXAMPLE, "--cluster", "nope"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.startswith("error: unknown cluster 'nope'") and "local-slurm" in p.stderr


def test_shell_metacharacters_reach_the_cluster_as_data(dev_cluster, client, tmp_path):
    """A job name and arguments full of metacharacters arrive verbatim; nothing is executed."""
    for f in ("/tmp/x", "/tmp/hyperpod-pwned"):
        if os.path.exists(f):
            os.remove(f)
    script = tmp_path / "echo_argv.py"
    script.write_text("import json, os, sys\n"
                      "open(os.path.join(os.environ['HYPERPOD_LAB_JOB_DIR'], 'argv.json'), 'w')"
                      ".write(json.dumps(sys.argv[1:]))\n")
    name = "'; touch /tmp/x; '$(touch /tmp/hyperpod-pwned)"
    args = ["'; touch /tmp/x; '", "$(id)", "`id`", "line1\nline2", "--flag=a b"]
    job_id = cli.run(["submit", str(script), "--cluster", "local-slurm", "--nodes", "1", "--name", name,
                      "--", *args], client=client)
    rec = client.wait(job_id, timeout_s=180)
    assert rec.status == "completed", client.logs(job_id)
    import json

    assert json.loads(open(os.path.join(rec.job_dir, "argv.json")).read()) == args
    assert not os.path.exists("/tmp/x") and not os.path.exists("/tmp/hyperpod-pwned")
    # slurmdbd fills the job's record asynchronously: until the job's start record arrives, sacct
    # shows its placeholder name "allocation" (seen once right after completion); wait it out
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobName%200", "-j", rec.native_id],
                             capture_output=True, text=True, check=True).stdout
        if out.strip() not in ("", "allocation") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert out.strip() == name
