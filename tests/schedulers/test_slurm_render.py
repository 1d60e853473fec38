"""Pure parts of the Slurm backend: the sbatch renderer (golden files) and the parsers of
sbatch / squeue / sacct output (literal text captured from Slurm 22.05)."""

import os
import subprocess
import time

import pytest
from goldens import assert_matches_golden

from hyperpod_lab.errors import SpecError
from hyperpod_lab.schedulers.slurm import parse_exit_code, parse_sacct, parse_sbatch, parse_squeue, render_sbatch, sbatch_argv
from hyperpod_lab.spec import ElasticPolicy, JobSpec, ResiliencyPolicy
from hyperpod_lab.submit.jobs import JobStatus

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")


def spec():
    return JobSpec(script="/home/me/train_lm.py", name="quick'start", cluster="local-slurm", nodes=2,
                   procs_per_node=1, args=["--steps", "40", "'; touch /tmp/x; '", "$(id)", "a\nb"],
                   env={"WANDB_MODE": "off"}, resiliency=ResiliencyPolicy(max_retries=3)).validate()


def ft_spec():
    s = spec()
    s.resiliency.recovery = "checkpointless"
    s.elastic = ElasticPolicy(min_nodes=1, max_nodes=4)
    return s.validate()


def gpu_spec():
    s = spec()
    s.procs_per_node = 8
    return s.validate()


@pytest.mark.parametrize("name, kwargs, make", [
    ("sbatch_requeue.sh", dict(partition="dev"), spec),
    ("sbatch_gpu_efa.sh", dict(partition=None, gpus_per_node=8, efa=True), gpu_spec),
    ("sbatch_checkpointless.sh", dict(partition="dev"), ft_spec),
    ("sbatch_checkpointless_join.sh", dict(partition="dev", join_offset=2, join_nodes=1), ft_spec),
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
    # the job: one step per node, placed by the supervisor (each its own replica group)
    assert "hyperpod_lab.node.supervisor" in job and "--mode=checkpointless" in job
    assert "HYPERPOD_LAB_REPLICA_GROUPS=2" in job
    # a joining allocation: one srun, the group of each task from its node id
    assert "HYPERPOD_LAB_REPLICA_GROUP=slurm" in join and "hyperpod_lab.node.supervisor" not in join
    assert "hyperpod_lab.node.lighthouse" in job and "--min-replicas=1" in job and "OFFSET=0" in job
    assert "hyperpod_lab.node.lighthouse" not in join and "OFFSET=2" in join and "#SBATCH --requeue" not in join
    with pytest.raises(SpecError, match="resiliency.recovery"):
        render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx", join_offset=2)
    with pytest.raises(SpecError, match="resiliency.recovery"):
        JobSpec(script="t.py", resiliency=ResiliencyPolicy(recovery="magic")).validate()


def test_hyperpod_is_detected_in_the_batch_script_and_requeue_is_not_forced_off():
    """awsome-distributed-training 3.test_cases/pytorch/FSDP/slurm/*-training.sbatch and
    3.test_cases/pytorch/ddp/slurm/1.venv-train.sbatch (and its PR #231, "Enable Auto-resume
    automatically"): the script tests ``[ -d "/opt/sagemaker_cluster" ]`` when it runs and adds
    ``--auto-resume=1`` to srun; they set neither --requeue nor --no-requeue. We keep --requeue
    with auto_resume on every cluster (Slurm's recovery of a lost allocation) and --no-requeue
    only when the user asked for no automatic restarts."""
    text = render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx")
    assert "if [ -d /opt/sagemaker_cluster ]; then" in text and 'auto_resume="--auto-resume=1"' in text
    assert "${auto_resume:+--srun-opt=$auto_resume}" in text and "#SBATCH --requeue" in text
    assert "--no-requeue" not in text and "    --requeue \\" in text  # the supervisor may requeue the job
    once = JobSpec(script="t.py", resiliency=ResiliencyPolicy(auto_resume=False)).validate()
    text = render_sbatch(once, "j", "/fsx/j", "python3", "/fsx")
    assert "#SBATCH --no-requeue" in text and "auto-resume" not in text and "    --requeue \\" not in text
    el = JobSpec(script="t.py", nodes=1, elastic=ElasticPolicy(1, 2)).validate()
    assert "--nnodes=1:2" in render_sbatch(el, "j", "/fsx/j", "python3", "/fsx")


def test_rendered_script_is_valid_bash_and_passes_args_verbatim(tmp_path):
    text = render_sbatch(spec(), "j", str(tmp_path), "python3", "/fsx")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    # evaluate the launch line's argument words with a stub srun that prints its argv
    words = run_with_stubs(text, tmp_path)
    assert words[-4:-1] == [b"'; touch /tmp/x; '", b"$(id)", b"a\nb"]
    assert not os.path.exists("/tmp/x")


def run_with_stubs(text, tmp_path, env=None):
    """Run a rendered script with stand-ins (named as such: no Slurm runs here) for ``srun``
    (drops its options, runs the rest as one task), ``scontrol`` and ``python3``, which prints
    its argv NUL-separated, except for the supervisor, which it plays for one node: it runs the
    words after ``--`` with ``{head_addr}`` replaced, as ``Supervisor.start_restart_step`` and
    ``start_group`` do. Returns the launcher's argv."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    (stub / "scontrol").write_text("#!/bin/bash\necho n1\n")
    (stub / "python3").write_text(
        '#!/bin/bash\n'
        'if [ "$2" = hyperpod_lab.node.supervisor ]; then\n'
        '  while [ "$1" != -- ]; do shift; done; shift\n'
        '  words=(); for a in "$@"; do words+=("${a//\\{head_addr\\}/127.0.0.1}"); done\n'
        '  exec "${words[@]}"\n'
        'fi\n'
        'for a in "$@"; do printf "%s\\0" "$a"; done\n')
    for f in stub.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1",
           "SLURM_JOB_NUM_NODES": "2", **(env or {})}
    out = subprocess.run(["bash", "-c", text], env=env, capture_output=True, check=True).stdout
    return out.split(b"\0")


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

SLURM_MAN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "slurm_man.json")


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


def all_renders():
    """Every shape of batch script: plain, GPU+EFA, no auto-resume, checkpointless and its join."""
    once = JobSpec(script="t.py", resiliency=ResiliencyPolicy(auto_resume=False)).validate()
    kw = dict(partition="dev")
    return [render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx", **kw),
            render_sbatch(gpu_spec(), "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8, efa=True, **kw),
            render_sbatch(once, "j", "/fsx/j", "python3", "/fsx", **kw),
            render_sbatch(ft_spec(), "j", "/fsx/j", "python3", "/fsx", **kw),
            render_sbatch(ft_spec(), "j", "/fsx/j", "python3", "/fsx", join_offset=2, **kw)]


def test_srun_gets_the_cpus_of_its_task_explicitly():
    """Slurm RELEASE_NOTES 22.05: "srun will no longer read in SLURM_CPUS_PER_TASK ... specify
    --cpus-per-task on your srun calls, or set the new SRUN_CPUS_PER_TASK"; RELEASE_NOTES 23.11
    replaces SRUN_CPUS_PER_TASK with SLURM_CPUS_PER_TASK again. Only the explicit srun option
    works on 22.05 to current, so every training step carries it."""
    for text in all_renders():
        cpus = [ln for ln in text.splitlines() if ln.startswith("#SBATCH --cpus-per-task=")][0].split("=")[1]
        srun = [ln for ln in text.splitlines() if ln.startswith("srun ")]  # a joining allocation's
        supervised = [ln for ln in text.splitlines() if ln.strip().startswith("--srun-opt=")]
        assert srun or supervised
        assert all(f" --cpus-per-task={cpus} " in ln for ln in srun)
        assert not supervised or f"    --srun-opt=--cpus-per-task={cpus} \\" in text


def test_gpus_per_process_exclusive_nodes_and_wait_all_nodes():
    """awsome-distributed-training 3.test_cases/pytorch/FSDP/slurm/llama3_1_8b-training.sbatch
    (``#SBATCH --exclusive``, one process a GPU: ``--nproc_per_node=$GPUS_PER_NODE``),
    3.test_cases/pytorch/ddp/slurm/1.venv-train.sbatch and megatron-lm/slurm/gpt3
    (``#SBATCH --wait-all-nodes=1``); sbatch(1) --gpus-per-node, --exclusive, --wait-all-nodes."""
    gpu = render_sbatch(gpu_spec(), "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)
    assert "#SBATCH --gpus-per-node=8\n" in gpu and "#SBATCH --exclusive\n" in gpu
    four = JobSpec(script="t.py", procs_per_node=4).validate()
    assert "#SBATCH --gpus-per-node=4\n" in render_sbatch(four, "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)
    cpu = render_sbatch(spec(), "j", "/fsx/j", "python3", "/fsx")
    assert "--gpus" not in cpu and "--exclusive" not in cpu  # a CPU partition is shared by default
    for text in all_renders():
        assert "#SBATCH --wait-all-nodes=1\n" in text
    shared = JobSpec(script="t.py", procs_per_node=8, exclusive=False).validate()
    assert "--exclusive" not in render_sbatch(shared, "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)
    mine = JobSpec(script="t.py", exclusive=True).validate()
    assert "#SBATCH --exclusive" in render_sbatch(mine, "j", "/fsx/j", "python3", "/fsx")
    with pytest.raises(SpecError, match="procs_per_node.*8 GPUs"):
        render_sbatch(JobSpec(script="t.py", procs_per_node=9).validate(), "j", "/fsx/j", "python3", "/fsx",
                      gpus_per_node=8)
    with pytest.raises(SpecError, match="exclusive"):
        JobSpec(script="t.py", exclusive="yes").validate()


def test_node_health_check_expects_the_gpus_the_job_asked_for():
    """Issue 25 #3: an 8-GPU profile with 4 processes a node asks ``--gpus-per-node=4``, so the
    step (and the health check's srun inside the allocation) sees 4 GPUs (sbatch(1)
    --gpus-per-node; Slurm sets CUDA_VISIBLE_DEVICES to the allocated GPUs): the check must expect
    4, not the profile's 8, or every healthy node fails ``torch sees 4 CUDA device(s)``
    (hyperpod_lab/node/health.py, _check_gpu). No GPUs in the profile: nothing expected."""
    four = JobSpec(script="t.py", procs_per_node=4).validate()
    text = render_sbatch(four, "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)
    assert "#SBATCH --gpus-per-node=4\n" in text
    assert "    --health-arg=--expect-gpus=4 \\\n" in text and "--expect-gpus=8" not in text
    one = JobSpec(script="t.py", procs_per_node=1).validate()
    assert "--health-arg=--expect-gpus=1 " in render_sbatch(one, "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)
    assert "--health-arg=--expect-gpus=0 " in render_sbatch(four, "j", "/fsx/j", "python3", "/fsx")


def test_srun_labels_each_line_with_its_task():
    """awsome-distributed-training FSDP sbatch scripts run ``srun ${AUTO_RESUME} -l ...``;
    srun(1) ``-l, --label``: prepend the task number to lines of stdout/err."""
    for text in all_renders():
        assert all(" --label " in ln for ln in text.splitlines() if ln.startswith("srun "))
        assert "srun " in text or "    --srun-opt=--label \\" in text


def sbatch_get_argument(line):
    """A port of get_argument() in Slurm's src/sbatch/opt.c (22.05 to current): how sbatch reads
    one argument of an #SBATCH line (quotes group, backslash escapes, unquoted # comments)."""
    out, quoted, q, esc, i = [], False, "", False, 0
    while i < len(line) and (quoted or not line[i].isspace()):
        c = line[i]
        if esc:
            esc = False
        elif c == "\\":
            esc, i = True, i + 1
            continue
        elif quoted:
            if c == q:
                quoted, i = False, i + 1
                continue
        elif c in "\"'":
            quoted, q, i = True, c, i + 1
            continue
        elif c == "#":
            break
        out.append(c)
        i += 1
    assert not quoted
    return "".join(out)


def test_paths_in_sbatch_lines_survive_spaces_percent_quotes_and_hash(tmp_path):
    """get_argument() in src/sbatch/opt.c (blanks split, quotes group, ``\\`` escapes, an unquoted
    ``#`` starts a comment) and sbatch(1) "filename pattern" (``%%`` is the character ``%``):
    a shared root with a space, a percent sign, a quote or a ``#`` reaches sbatch whole."""
    job_dir, out_line = _awkward_output_line(tmp_path)
    value = sbatch_get_argument(out_line[len("#SBATCH --output="):])
    assert value == job_dir.replace("%", "%%") + "/logs/slurm-%j.out"


def _awkward_output_line(tmp_path) -> tuple[str, str]:
    root = str(tmp_path / 'shared dir/100% "x" #1')
    job_dir = root + "/hyperpod-lab/jobs/j"
    text = render_sbatch(spec(), "j", job_dir, "python3", root)
    return job_dir, [ln for ln in text.splitlines() if ln.startswith("#SBATCH --output=")][0]


def test_a_real_sbatch_writes_its_output_under_an_awkward_shared_root(dev_cluster, tmp_path):
    """The same rendered ``#SBATCH --output`` line, read by the dev cluster's real sbatch (Slurm
    22.05): the job's output lands in the directory with a space, ``%``, quotes and ``#``."""
    job_dir, out_line = _awkward_output_line(tmp_path)
    os.makedirs(job_dir + "/logs")
    job = tmp_path / "probe.sbatch"
    job.write_text("#!/bin/bash\n" + out_line + "\n#SBATCH --wait-all-nodes=1\n"
                   "srun --label --cpus-per-task=1 echo probe-ok\n")
    jid = subprocess.run(["sbatch", "--parsable", str(job)], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.strip()
    path = f"{job_dir}/logs/slurm-{jid}.out"
    deadline = time.monotonic() + 60
    while not (os.path.exists(path) and "probe-ok" in open(path).read()):
        assert time.monotonic() < deadline, f"no output at {path}"
        time.sleep(0.5)
    assert open(path).read().strip() == "0: probe-ok"


def test_each_auto_resume_rerun_of_the_step_has_its_own_rendezvous(tmp_path):
    """HyperPod auto-resume re-runs the srun step inside the allocation without changing
    SLURM_RESTART_COUNT (FACTS.md, "What the upstream sources say"; AWS docs "Automatic node
    recovery and auto-resume"), and with the same argv. The step computes its rendezvous from
    SLURM_RESTART_COUNT, SLURM_STEP_ID and a per-node start counter in the job directory: the
    nodes of one run agree, a re-run (same step id) and a requeue each get a new id and port."""
    text = render_sbatch(spec(), "j", str(tmp_path / "job"), "python3", "/fsx")

    def rdzv(**env):
        words = run_with_stubs(text, tmp_path, {"SLURM_STEP_ID": "0", **env})
        return [w.decode() for w in words if w.startswith((b"--rdzv-id=", b"--rdzv-endpoint="))]

    first = [rdzv(SLURM_NODEID=str(n)) for n in (0, 1)]
    assert first[0] == first[1] and first[0][1] == "--rdzv-id=7.0.0.0"
    rerun = [rdzv(SLURM_NODEID=str(n)) for n in (0, 1)]
    assert rerun[0] == rerun[1] and rerun[0][1] == "--rdzv-id=7.0.0.1" and rerun[0][0] != first[0][0]
    requeued = rdzv(SLURM_NODEID="0", SLURM_RESTART_COUNT="1")
    assert requeued[1] == "--rdzv-id=7.1.0.0" and requeued[0] not in (first[0][0], rerun[0][0])
    new_step = rdzv(SLURM_NODEID="0", SLURM_STEP_ID="3")
    assert new_step[1] == "--rdzv-id=7.0.3.0"



def test_rendezvous_ports_stay_below_the_ephemeral_port_range(tmp_path):
    """The Linux kernel's Documentation/networking/ip-sysctl.rst, ip_local_port_range: "The
    default values are 32768 and 60999". A rendezvous port inside that range can be the local port
    of any outgoing connection on the head node (NCCL, SSH, storage clients) and then the store
    cannot bind it: seen once in a loaded fresh-clone CI run, a rank timing out on 127.0.0.1:35952.
    Every job id, restart, step and attempt maps into 29500-32767."""
    text = render_sbatch(spec(), "j", str(tmp_path / "job"), "python3", "/fsx")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("rdzv_port=$(("))
    expr = line.strip()[len("rdzv_port=$(("):-len("))")]
    ports = set()
    for job_id in (1, 7, 4095, 35952, 999983, 2 ** 31 - 1):
        for restart in range(4):
            for step in range(3):
                for attempt in range(3):
                    env = {"SLURM_JOB_ID": job_id, "restart": restart, "step": step, "attempt": attempt}
                    port = eval(expr, {}, env)  # the shell's integer arithmetic, same operators
                    assert 29500 <= port < 32768, (env, port)
                    ports.add(port)
    assert len(ports) > 100  # still spread out

def test_efa_nodes_get_the_variables_of_the_aws_scripts():
    """awsome-distributed-training 3.test_cases/pytorch/FSDP/slurm/llama3_1_8b-training.sbatch,
    "Environment Variables": FI_PROVIDER=efa, FI_EFA_USE_HUGE_PAGE=0 (os.fork() ENOMEM),
    FI_EFA_SET_CUDA_SYNC_MEMOPS=0, NCCL_SOCKET_IFNAME excluding docker/lo/veth. Only with the
    profile's ``efa``; the spec's own env comes after and wins."""
    efa = render_sbatch(gpu_spec(), "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8, efa=True)
    for line in ("export FI_PROVIDER=efa", "export FI_EFA_USE_HUGE_PAGE=0", "export FI_EFA_SET_CUDA_SYNC_MEMOPS=0",
                 "export NCCL_SOCKET_IFNAME='^docker,lo,veth'"):
        assert line + "\n" in efa
    assert efa.index("FI_PROVIDER") < efa.index("export WANDB_MODE")
    assert "FI_PROVIDER" not in render_sbatch(gpu_spec(), "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)


def test_every_rendered_option_is_in_the_man_pages_since_22_05():
    """sbatch(1) and srun(1) OPTIONS of every Slurm release 14.03 to 25.11
    (tests/fixtures/slurm_man.json, taken from SchedMD/slurm doc/man/man1): every option we
    render exists from 22.05 (the oldest release we support; the dev cluster runs it) to the
    newest. ``--auto-resume`` is HyperPod's SPANK plugin option, rendered only on HyperPod
    nodes; ``--parsable``, ``--job-name`` and ``--chdir`` are sbatch's command line."""
    import re

    from hyperpod_lab.schedulers.slurm import sbatch_argv

    man = slurm_man()

    def ok(cmd, opt):
        info = man[cmd + "_options"].get(opt)
        assert info, f"{cmd} {opt} is in no man page"
        since = tuple(map(int, info["since"].split(".")))
        assert since <= (22, 5) and info["last"] == man["versions"][-1], (cmd, opt, info)

    for text in all_renders():
        for line in text.splitlines():
            if line.startswith("#SBATCH "):
                ok("sbatch", line.split()[1].split("=")[0])
            if line.startswith("srun "):
                for opt in re.findall(r"(?<= )--[a-z-]+", line):
                    ok("srun", opt)
    for word in sbatch_argv("n", "/fsx/j")[1:-1]:
        ok("sbatch", word.split("=")[0])


def test_spares_health_checks_and_no_kill_reach_the_supervisor():
    """sbatch(1) ``--no-kill``: "Do not automatically terminate a job if one of the nodes it has
    been allocated fails ... The job will assume all responsibilities for fault-tolerance": every
    job of ours has it, and its supervisor (hyperpod_lab.node.supervisor) takes them. The
    allocation is ``nodes + spares``; training uses ``nodes``."""
    s = spec()
    s.resiliency.spares = 1
    text = render_sbatch(s.validate(), "j", "/fsx/j", "python3", "/fsx")
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --no-kill\n" in text
    assert "    --nodes=2 \\" in text and "    --spares=1 \\" in text and "    --mode=restart \\" in text
    assert "    --health-checks \\" in text and "--health-arg=--expect-gpus=0" in text
    s.resiliency.health_checks = False
    assert "--health-checks" not in render_sbatch(s, "j", "/fsx/j", "python3", "/fsx")
    gpu = render_sbatch(gpu_spec(), "j", "/fsx/j", "python3", "/fsx", gpus_per_node=8)
    assert "--health-arg=--expect-gpus=8" in gpu
    with pytest.raises(SpecError, match="resiliency.spares"):
        JobSpec(script="t.py", resiliency=ResiliencyPolicy(spares=-1)).validate()
    with pytest.raises(SpecError, match="resiliency.spares"):
        JobSpec(script="t.py", resiliency=ResiliencyPolicy(spares=65)).validate()
