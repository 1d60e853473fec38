"""Pure parts of the Slurm backend: the sbatch renderer (golden files) and the parsers of
sbatch / squeue / sacct output (literal text captured from Slurm 22.05)."""

import os
import subprocess

import pytest

from hyperpod_lab.errors import SpecError
from hyperpod_lab.jobs import JobStatus
from hyperpod_lab.schedulers.slurm import (parse_exit_code, parse_sacct, parse_sbatch, parse_squeue,
                                           render_sbatch, sbatch_argv)
from hyperpod_lab.spec import ElasticPolicy, JobSpec, ResiliencyPolicy
from goldens import assert_matches_golden

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def spec():
    return JobSpec(script="/home/me/train_lm.py", name="quick'start", cluster="local-slurm", nodes=2,
                   procs_per_node=1, args=["--steps", "40", "'; touch /tmp/x; '", "$(id)", "a\nb"],
                   env={"WANDB_MODE": "off"}, resiliency=ResiliencyPolicy(max_retries=3)).validate()


def ft_spec():
    s = spec()
    s.resiliency.recovery = "checkpointless"
    s.elastic = ElasticPolicy(min_nodes=1, max_nodes=4)
    return s.validate()


@pytest.mark.parametrize("name, kwargs, make", [
    ("sbatch_requeue.sh", dict(hyperpod=False, partition="dev"), spec),
    ("sbatch_hyperpod.sh", dict(hyperpod=True, partition=None), spec),
    ("sbatch_checkpointless.sh", dict(hyperpod=False, partition="dev"), ft_spec),
    ("sbatch_checkpointless_join.sh", dict(hyperpod=False, partition="dev", join_offset=2, join_nodes=1), ft_spec),
])
def test_render_matches_golden(name, kwargs, make):
    text = render_sbatch(make(), "quick-start-20261123-010203-abcd", "/fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd",
                         "/opt/venv/bin/python", "/fsx", **kwargs)
    assert_matches_golden(text, os.path.join(GOLDEN, name), "sbatch")


def test_checkpointless_renders_replica_groups_under_a_lighthouse():
    job = render_sbatch(ft_spec(), "j", "/fsx/j", "python3", "/fsx")
    join = render_sbatch(ft_spec(), "j", "/fsx/j", "python3", "/fsx", join_offset=2)
    for text in (job, join):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        assert "#SBATCH --no-kill" in text and "--standalone --nnodes=1" in text and "--rdzv-backend" not in text
        assert "HYPERPOD_LAB_REPLICA_GROUP=slurm" in text
    assert "hyperpod_lab.runtime.lighthouse" in job and "--min-replicas=1" in job and "OFFSET=0" in job
    assert "hyperpod_lab.runtime.lighthouse" not in join and "OFFSET=2" in join and "#SBATCH --requeue" not in join
    with pytest.raises(SpecError, match="resiliency.recovery"):
        render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx", join_offset=2)
    with pytest.raises(SpecError, match="resiliency.recovery"):
        JobSpec(script="t.py", resiliency=ResiliencyPolicy(recovery="magic")).validate()


def test_hyperpod_uses_auto_resume_and_elsewhere_requeue():
    hp = render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx", hyperpod=True)
    plain = render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx", hyperpod=False)
    assert "--auto-resume=1" in hp and "#SBATCH --requeue" not in hp
    assert "--auto-resume=1" not in plain and "#SBATCH --requeue" in plain
    el = JobSpec(script="t.py", nodes=1, elastic=ElasticPolicy(1, 2)).validate()
    assert "--nnodes=1:2" in render_sbatch(el, "j", "/fsx/j", "python3", "/fsx")


def test_rendered_script_is_valid_bash_and_passes_args_verbatim(tmp_path):
    text = render_sbatch(spec(), "j", str(tmp_path), "python3", "/fsx")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    # evaluate the launch line's argument words with a stub srun that prints its argv
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "srun").write_text('#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    (stub / "scontrol").write_text("#!/bin/bash\necho n1\n")
    for f in stub.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1",
           "SLURM_JOB_NUM_NODES": "2"}
    out = subprocess.run(["bash", "-c", text], env=env, capture_output=True, check=True).stdout
    words = out.split(b"\0")
    assert words[-4:-1] == [b"'; touch /tmp/x; '", b"$(id)", b"a\nb"]
    assert not os.path.exists("/tmp/x")


def test_sbatch_argv_keeps_name_as_one_word():
    argv = sbatch_argv("'; touch /tmp/x; '", "/fsx/j")
    assert argv[2] == "--job-name='; touch /tmp/x; '"


def test_parse_sbatch():
    assert parse_sbatch("1234\n") == "1234"
    assert parse_sbatch("warning: something\n99;hyperpod-dev\n") == "99"
    with pytest.raises(Exception, match="no job id"):
        parse_sbatch("sbatch: error: Batch job submission failed\n")


def test_parse_squeue_literal():
    text = "12|RUNNING|None\n13|PENDING|Resources\n14_2|COMPLETING|None\n15|COMPLETED|None\n"
    got = parse_squeue(text)
    assert got["12"] == (JobStatus.RUNNING, "")
    assert got["13"] == (JobStatus.PENDING, "Resources")
    assert got["14"][0] == JobStatus.RUNNING
    assert got["15"][0] == JobStatus.COMPLETED


def test_parse_sacct_literal():
    text = ("21|COMPLETED|0:0\n22|FAILED|1:0\n23|CANCELLED by 0|0:15\n24|NODE_FAIL|0:0\n"
            "25|REQUEUED|0:0\n25|RUNNING|0:0\n26.batch|COMPLETED|0:0\n")
    got = parse_sacct(text)
    assert got["21"] == (JobStatus.COMPLETED, 0, "COMPLETED")
    assert got["22"][:2] == (JobStatus.FAILED, 1)
    assert got["23"][:2] == (JobStatus.CANCELLED, 128 + 15)
    assert got["24"][0] == JobStatus.FAILED
    assert got["25"][0] == JobStatus.RUNNING  # the last row of a requeued job wins
    assert "26.batch" not in got
    assert parse_exit_code("garbage") is None


def test_parse_sinfo_literal():
    """``sinfo -N -h -o '%N|%t|%c|%P'``: the first two lines were captured from the dev cluster
    (Slurm 22.05); the others follow the sinfo man page's NODE STATE CODES (a ``*`` suffix: not
    responding; a node listed once per partition, the default partition marked ``*``)."""
    from hyperpod_lab.schedulers.slurm import parse_sinfo

    text = "n1|idle|2|dev*\nn2|idle|2|dev*\nn3|down*|8|dev*\nn3|down*|8|gpu\nn4|drain|N/A|gpu\nnot a row\n"
    assert parse_sinfo(text) == [
        {"name": "n1", "state": "idle", "cpus": 2, "partitions": ["dev"]},
        {"name": "n2", "state": "idle", "cpus": 2, "partitions": ["dev"]},
        {"name": "n3", "state": "down*", "cpus": 8, "partitions": ["dev", "gpu"]},
        {"name": "n4", "state": "drain", "cpus": None, "partitions": ["gpu"]},
    ]
    assert parse_sinfo("") == []


# ---- conformance with the Slurm sources (issue 17) -------------------------------------------
import json  # noqa: E402

from hyperpod_lab.schedulers.slurm import slurm_state  # noqa: E402

SLURM_MAN = os.path.join(os.path.dirname(__file__), "fixtures", "slurm_man.json")


def slurm_man():
    with open(SLURM_MAN) as f:
        return json.load(f)


def test_every_state_of_squeue_and_sacct_22_05_to_current_is_known():
    """squeue(1) and sacct(1), section JOB STATE CODES, and job_state_string() in
    src/common/slurm_protocol_defs.c (what ``%T`` / ``State`` print), Slurm 22.05 to 25.11
    (tests/fixtures/slurm_man.json): every state maps to a status, none to UNKNOWN except
    REVOKED (the job runs on another cluster of a federation). EXPEDITING is new in 25.11."""
    seen = set()
    for version, lists in slurm_man()["states"].items():
        for states in lists.values():
            seen |= set(states)
    assert "EXPEDITING" in seen and "SPECIAL_EXIT" in seen
    unknown = sorted(s for s in seen if slurm_state(s) == JobStatus.UNKNOWN)
    assert unknown == ["REVOKED"]
    assert slurm_state("EXPEDITING") == JobStatus.PENDING


def test_revoked_and_special_exit_mean_what_the_man_pages_say():
    """squeue(1) JOB STATE CODES: SPECIAL_EXIT "The job was requeued in a special state" (held,
    like REQUEUE_HOLD: not ended); REVOKED "Sibling was removed from cluster due to other
    cluster starting the job" (it runs elsewhere: not failed). Neither is terminal."""
    got = parse_squeue("31|SPECIAL_EXIT|JobHeldUser\n32|REVOKED|None\n")
    assert got["31"][0] == JobStatus.PENDING and "scontrol release" in got["31"][1]
    assert got["31"][1].endswith("JobHeldUser")
    assert got["32"][0] == JobStatus.UNKNOWN and "another cluster" in got["32"][1]
    acct = parse_sacct("33|REVOKED|0:0\n34|SPECIAL_EXIT|3:0\n")
    assert not acct["33"][0].is_terminal() and not acct["34"][0].is_terminal()
    assert acct["34"][1] == 3 and acct["34"][2].startswith("SPECIAL_EXIT (")


def test_a_pipe_inside_the_reason_stays_in_the_reason():
    """squeue(1) ``%r``: the reason is free text when an administrator sets it
    (``scontrol update job=.. reason=...``); ``-o '%i|%T|%r'`` puts it last, so everything after
    the second ``|`` is the reason."""
    got = parse_squeue("40|PENDING|held by admin | maintenance|window\n")
    assert got["40"] == (JobStatus.PENDING, "held by admin | maintenance|window")


def test_array_and_het_ids_are_read_alike_by_both_parsers():
    """squeue(1) ``%i`` and sacct(1) ``JobID``: an array task is ``<jobid>_<taskid>`` (pending
    tasks ``<jobid>_[<range>]``), a heterogeneous component ``<jobid>+<offset>``; a step is
    ``<job>.<step>``. Both parsers keep each component under its own id, sum them up under the
    base id the same way (a component still going wins, then one that did not complete), and
    skip steps."""
    sq = parse_squeue("50_1|COMPLETED|None\n50_2|RUNNING|None\n50_[3-9%2]|PENDING|JobArrayTaskLimit\n"
                      "60+0|RUNNING|None\n60+1|RUNNING|None\n70_1|COMPLETED|None\n70_2|FAILED|NonZeroExitCode\n")
    sa = parse_sacct("50_1|COMPLETED|0:0\n50_2|RUNNING|0:0\n50_[3-9%2]|PENDING|0:0\n50_1.batch|COMPLETED|0:0\n"
                     "60+0|RUNNING|0:0\n60+1|RUNNING|0:0\n60+0.0|RUNNING|0:0\n70_1|COMPLETED|0:0\n70_2|FAILED|1:0\n")
    assert set(sq) == set(sa) == {"50_1", "50_2", "50_[3-9%2]", "50", "60+0", "60+1", "60", "70_1", "70_2", "70"}
    for jid in sq:
        assert sq[jid][0] == sa[jid][0], jid
    assert sq["50"][0] == JobStatus.RUNNING and sq["60"][0] == JobStatus.RUNNING
    assert sq["70"][0] == JobStatus.FAILED and sa["70"][1] == 1
