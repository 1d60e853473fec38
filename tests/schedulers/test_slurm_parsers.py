"""Every parser of Slurm's output reads each form the tools document, and never reads a field
shifted (issue 24, finding 16).

The literal outputs below were captured from the dev cluster's Slurm 22.05.8 (``sinfo
--version``: ``slurm-wlm 22.05.8``) with the exact argv the backend runs; the forms are the man
pages' (the man text quoted at each test; ``tests/fixtures/slurm_man.json`` holds the state names of
squeue(1)/sacct(1) "JOB STATE CODES" and job_state_string(), 22.05 to 25.11).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from hyperpod_lab.node import supervisor
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.schedulers.slurm import (
    SACCT_FIELDS,
    SINFO_ARGV,
    SlurmScheduler,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
    slurm_state,
)
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord, JobStatus

MAN = json.load(open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "slurm_man.json")))

# sacct(1), OPTIONS: "-p, --parsable  output will be '|' delimited with a '|' at the end";
# "-P, --parsable2  output will be '|' delimited without a '|' at the end" (sacct --help, 22.05.8).
# Captured: `sacct -n -p -X -o JobID,State,ExitCode -j 356` and the same with -P, job 356 cancelled.
SACCT_P = "356|CANCELLED by 0|0:0|\n353|FAILED|1:0|\n355|COMPLETED|0:0|\n"
SACCT_P2 = "356|CANCELLED by 0|0:0\n353|FAILED|1:0\n355|COMPLETED|0:0\n"


def test_sacct_parsable_and_parsable2_read_the_same():
    want = {"356": (JobStatus.CANCELLED, 0, "CANCELLED by 0"), "353": (JobStatus.FAILED, 1, "FAILED"),
            "355": (JobStatus.COMPLETED, 0, "COMPLETED")}
    assert parse_sacct(SACCT_P2) == want
    assert parse_sacct(SACCT_P) == want  # today's main: the trailing '|' made every exit code None


def test_sacct_never_reads_a_shifted_field():
    # a line with a field too many or too few (another -o, a JobName holding '|') is skipped, not
    # read with ExitCode taken from the wrong column
    assert parse_sacct("7|my|job|FAILED|2:0\n8|FAILED\n") == {}
    # empty fields: a pending job's ExitCode can be empty; "Unknown" is no exit code
    assert parse_sacct("9|PENDING|\n10|RUNNING|Unknown\n") == {
        "9": (JobStatus.PENDING, None, "PENDING"), "10": (JobStatus.RUNNING, None, "RUNNING")}
    # a signal (EXIT:SIGNAL, sacct(1) "ExitCode ... the signal number that caused the process to terminate")
    assert parse_sacct("11|CANCELLED by 1000|0:15\n")["11"][1] == 128 + 15
    assert SACCT_FIELDS == ("JobID", "State", "ExitCode")


# squeue(1): "%i Job or job step id. In the case of job arrays, the job ID format will be of the
# form "<base_job_id>_<index>""; "%T Job state in extended form"; "%r The reason a job is in its
# current state". Captured: `squeue -h --states=all -o '%i|%T|%r' -j 356` (running, then cancelled).
def test_squeue_reason_is_the_rest_of_the_line_and_none_is_no_reason():
    assert parse_squeue("356|RUNNING|None\n") == {"356": (JobStatus.RUNNING, "")}
    assert parse_squeue("356|CANCELLED|None\n") == {"356": (JobStatus.CANCELLED, "")}
    out = parse_squeue("5|PENDING|ReqNodeNotAvail, UnavailableNodes:n[1-3,5]|maint\n6|PENDING|(null)\n")
    assert out["5"] == (JobStatus.PENDING, "ReqNodeNotAvail, UnavailableNodes:n[1-3,5]|maint")
    assert out["6"] == (JobStatus.PENDING, "")
    # a line without the three fields is no job row (today's main read "7|RUNNING" as a job)
    assert parse_squeue("7|RUNNING\n|RUNNING|x\n") == {}
    # a pending reason that waiting does not clear gets what to do (squeue(1), JOB REASON CODES;
    # PartitionConfig: an 8-process-a-node job on the dev cluster's 2-CPU nodes, 2026-11-27)
    st, reason = parse_squeue("8|PENDING|PartitionConfig\n")["8"]
    assert st == JobStatus.PENDING and reason.startswith("PartitionConfig: no node of the partition has")
    assert "--procs-per-node" in reason and "cancel it" in reason
    assert parse_squeue("9|PENDING|Resources\n")["9"] == (JobStatus.PENDING, "Resources")  # waiting clears it
    # array tasks and het components keep their own ids and sum up under the base id
    arr = parse_squeue("8_1|COMPLETED|None\n8_[2-3]|PENDING|Resources\n")
    assert arr["8"][0] == JobStatus.PENDING and set(arr) == {"8_1", "8_[2-3]", "8"}


# sinfo(1): "%N List of node names"; "%t State of nodes, compact form"; "%c Number of CPUs per
# node"; "%P Partition name followed by "*" for the default partition". Captured:
# `sinfo -N -h -o '%N|%t|%c|%P'` on the dev cluster while job 356 ran on n1.
SINFO = "n1|mix|2|dev*\nn2|idle|2|dev*\nn3|idle|2|dev*\n"


def test_sinfo_one_entry_per_node():
    assert SINFO_ARGV == ["sinfo", "-N", "-h", "-o", "%N|%t|%c|%P"]
    nodes = parse_sinfo(SINFO + "n3|idle|2|gpu\nbroken line\nn4|down*|\n")
    assert nodes == [{"name": "n1", "state": "mix", "cpus": 2, "partitions": ["dev"]},
                     {"name": "n2", "state": "idle", "cpus": 2, "partitions": ["dev"]},
                     {"name": "n3", "state": "idle", "cpus": 2, "partitions": ["dev", "gpu"]}]


def test_every_documented_state_has_a_meaning():
    """Every state job_state_string() prints (22.05 to 25.11) maps to a JobStatus other than UNKNOWN,
    but REVOKED (a federation sibling: this cluster cannot say)."""
    for ver, forms in MAN["states"].items():
        for word in forms["job_state_string()"]:
            assert slurm_state(word) != JobStatus.UNKNOWN or word == "REVOKED", (ver, word)


def test_real_output_with_separators_in_the_name_and_comment(dev_cluster, tmp_path):
    """A live job whose name and comment hold '|' and spaces: the backend's own argv, parsed."""
    tag = f"{os.getpid()}-{time.time_ns()}"
    name, comment = f"my | odd  name NodeList=n9 {tag}", f"hyperpod-lab:parsers-{tag}|x y"
    jid = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--comment={comment}", "-p", "dev",
                          "--output=/dev/null", "--wrap", "sleep 300"], capture_output=True, text=True,
                         check=True).stdout.strip().split(";")[0]
    try:
        sched = SlurmScheduler(ClusterProfile(name="t", orchestrator="slurm", shared_root=str(tmp_path)), LocalRemote())
        rec = JobRecord(job_id=f"parsers-{tag}|x y", name=name, cluster="t", orchestrator="slurm", native_id="",
                        job_dir=str(tmp_path), spec={})
        # squeue's %k (the comment) is the last field: '|' inside it stays in it
        assert sched.find_native_id(rec) == jid
        rec.native_id = jid
        deadline = time.monotonic() + 30
        while sched.poll([rec])[rec.job_id][0] != JobStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sched.poll([rec])[rec.job_id][0] == JobStatus.RUNNING
        # the supervisor's node list: the job's own, not the "NodeList=n9" inside its name
        held = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%N"], capture_output=True, text=True,
                              check=True).stdout.strip()
        assert held and supervisor.job_nodes(jid) == supervisor.expand_nodelist(held) != ["n9"]
        subprocess.run(["scancel", jid], check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            p = subprocess.run(["sacct", "-n", "-p", "-X", "-o", ",".join(SACCT_FIELDS), "-j", jid],
                               capture_output=True, text=True).stdout
            p2 = subprocess.run(["sacct", "-n", "-P", "-X", "-o", ",".join(SACCT_FIELDS), "-j", jid],
                                capture_output=True, text=True).stdout
            if "CANCELLED" in p2 and "CANCELLED" in p:
                break
            time.sleep(0.5)
        assert p.rstrip("\n").endswith("|") and not p2.rstrip("\n").endswith("|")
        assert parse_sacct(p) == parse_sacct(p2)
        assert parse_sacct(p)[jid][:2] == (JobStatus.CANCELLED, 0)
    finally:
        subprocess.run(["scancel", jid], capture_output=True)


def test_a_node_reason_with_spaces_and_equals_signs_is_read_whole(dev_cluster):
    """sinfo(1) ``%E``: the reason a node is unavailable, whole; the supervisor used to cut
    ``scontrol show node``'s ``Reason=`` at the first ``word=`` inside it."""
    reason = f"maintenance ticket=42 by admin {os.getpid()}"
    subprocess.run(["scontrol", "update", "NodeName=n3", "State=DRAIN", f"Reason={reason}"], check=True)
    try:
        assert supervisor.node_reason("n3") == reason
    finally:
        subprocess.run(["scontrol", "update", "NodeName=n3", "State=RESUME"], check=True)
    assert supervisor.node_reason("n3") is None
