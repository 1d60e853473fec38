"""Slurm backend, reached over SSH.

The backend only renders (``render_sbatch``, pure), builds argv lists and parses outputs
(``parse_*``, pure); the job lifecycle belongs to ``hyperpod_lab.submit.client``. Every command goes
through :mod:`hyperpod_lab.schedulers.remote` as an argv list.

Resiliency: inside the allocation, torchrun's elastic agent (wrapped by
``hyperpod_lab.node.launch``) restarts failed workers up to ``max_retries`` times and the
runtime resumes from the newest complete checkpoint. The batch script itself detects HyperPod
when it starts (``/opt/sagemaker_cluster`` exists, the test AWS's scripts make) and then runs
the step under ``srun --auto-resume=1`` so HyperPod replaces a faulty node and re-runs the
step; the job is submitted with ``--requeue`` so Slurm requeues it after losing its
allocation, and the runtime again resumes from its checkpoint. Each run of the step (a requeue
or an auto-resume re-run) has its own rendezvous id and port (see ``_step_script``), so a
process left over from an earlier run (a node marked DOWN that still runs, cut off by the
network) can neither join the new rendezvous nor hold its port. What else the script sets, and
why, is in :func:`render_sbatch`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex

from hyperpod_lab import envexec
from hyperpod_lab._version import __version__
from hyperpod_lab.errors import HyperPodLabError, JobStateError, RemoteCommandError, SpecError
from hyperpod_lab.jobdir import (
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_REPLICA_GROUP,
    ENV_REPLICA_GROUP_OFFSET,
    ENV_REPLICA_GROUPS,
    ENV_SHARED_ROOT,
    ENV_SPEC,
    SLURM_REPLICA_GROUP,
    JobPaths,
    effective_restarts,
    launcher_argv,
    lighthouse_argv,
)
from hyperpod_lab.schedulers.base import LogChunk, Scheduler, read_log_range
from hyperpod_lab.schedulers.remote import StagedFile
from hyperpod_lab.spec import RECOVERY_CHECKPOINTLESS, JobSpec, enroot_image, validate_container_image
from hyperpod_lab.submit.jobs import JobStatus

HYPERPOD_MARKER = "/opt/sagemaker_cluster"
RDZV_PORT_BASE = 29500  # + (SLURM_JOB_ID + RDZV_PORT_RUN_STRIDE * <run number>) % RDZV_PORT_SPAN, see _step_script
#: rendezvous ports stay in 29500-32699, below Linux's default ephemeral range (net.ipv4.ip_local_port_range
#: 32768-60999, Documentation/networking/ip-sysctl.rst): a port inside it can be the local port of
#: any outgoing connection on the head node (NCCL, SSH, storage clients), and the rendezvous store
#: then cannot bind it
RDZV_PORT_SPAN = 3200
RDZV_PORT_RUN_STRIDE = 7919  # a prime: a requeued run's port is far from its neighbours' ports

SLURM_UMASK = "0077"  # the job's output files (slurm-%j.out) private to the user
COMMENT_PREFIX = "hyperpod-lab:"  # + job id, in #SBATCH --comment

_q = shlex.quote


# EFA: what AWS's reference batch scripts export on EFA instances (awsome-distributed-training,
# 3.test_cases/pytorch/FSDP/slurm/*-training.sbatch, "Environment Variables"); the spec's own
# env comes after and wins.
EFA_ENV = {
    "FI_PROVIDER": "efa",
    # "Set to 0 when you see os.fork() causes OSError: Cannot allocate memory": the runtime's
    # process-based checkpoint writers and DataLoader workers fork
    "FI_EFA_USE_HUGE_PAGE": "0",
    "FI_EFA_SET_CUDA_SYNC_MEMOPS": "0",  # "can boost throughput with FSDP"
    "NCCL_SOCKET_IFNAME": "^docker,lo,veth",  # bootstrap over the host's interfaces, not containers' or loopback
}


#: the interpreter that runs the training step inside a container image (``srun --container-image``):
#: the image's own ``python`` on its PATH, as AWS's container sbatch scripts run it
#: (awsome-distributed-training 3.test_cases/megatron/megatron-lm/slurm/gpt3/2.distributed-training.sbatch:
#: ``srun ... "${ARGS[@]}" python -m torch.distributed.run``); it needs hyperpod-lab and torch
CONTAINER_PYTHON = "python"
#: host paths bound into the container besides the shared root: ``/dev/shm``, where the memory
#: checkpoint tier keeps its slots (:func:`hyperpod_lab.jobdir.shm_root`) so that a re-run of the
#: step (a new container) finds them, and where NCCL's shared-memory transport lives. enroot's
#: default mounts (conf/mounts/10-system.fstab) bind it too; a site may drop them, so it is explicit.
CONTAINER_HOST_MOUNTS = ("/dev/shm",)


def pyxis_srun_opts(image: str, shared_root: str, workdir: str, env_names=()) -> list[str]:
    """The srun options that run a step in ``image`` through pyxis (pure; words not shell-quoted).

    Every option is one of pyxis's (NVIDIA/pyxis README "Usage" and ``args.c``; checked against
    every release from v0.19.0, the one HyperPod's lifecycle scripts install, to the newest by
    tests/schedulers/test_containers.py with tests/fixtures/pyxis_options.json):

    * ``--container-image=<image>``: :func:`hyperpod_lab.spec.enroot_image` of ``image`` (a
      registry image in the ``REGISTRY#IMAGE`` form every enroot reads, or a squashfs path).
    * ``--container-mounts=<shared_root>:<shared_root>,/dev/shm:/dev/shm``: the job directory,
      script, events and checkpoints at the same paths as on the host (as the AWS scripts'
      ``--container-mounts /fsx:/fsx``), and :data:`CONTAINER_HOST_MOUNTS`.
    * ``--container-workdir=<workdir>``: the step starts in the job directory as it does without
      a container (sbatch ``--chdir``); pyxis otherwise starts it in the image's WORKDIR.
    * ``--no-container-mount-home``: the user's home (and its ``~/.local`` packages) stays out, so
      the image's interpreter runs what the image holds (AWS's NeMo ``bcm.yaml`` srun_args and
      nemotron nsight script do the same).
    * ``--container-env=<names>`` when ``env_names``: the job's own variables (``env``,
      ``secret_env``) win over the image's ENV of the same name, as without a container (pyxis
      README: by default "their existing values in the image take precedence").

    Args:
        image: a ``container_image`` value (validated here).
        shared_root: the cluster's shared-storage root, bound at the same path.
        workdir: the step's working directory inside the container (the job directory, under
            ``shared_root``).
        env_names: variable names whose host values must win inside the container.

    Raises:
        SpecError: ``container_image`` is not an image (:func:`hyperpod_lab.spec.validate_container_image`),
            ``shared_root`` holds a ',' or ':' (pyxis splits ``--container-mounts`` on them:
            ``SRC:DST[:FLAGS][,SRC:DST...]``), or ``workdir`` is not under it.
    """
    validate_container_image("container_image", image)
    for path in (shared_root, *CONTAINER_HOST_MOUNTS):
        if not path.startswith("/") or re.search(r"[,:\s]", path):
            raise SpecError("container_image", f"the shared root {path!r} cannot be bound into a container: pyxis's "
                                               "--container-mounts (SRC:DST[:FLAGS][,SRC:DST...]) needs an absolute "
                                               "path without ',', ':' or whitespace; move the cluster's shared_root, "
                                               "or submit without a container image")
    root = shared_root.rstrip("/") or "/"
    if workdir != root and not workdir.startswith(root.rstrip("/") + "/"):
        raise SpecError("container_image", f"the working directory {workdir!r} is not under the shared root "
                                           f"{shared_root!r}, the only host directory bound into the container")
    mounts = ",".join(f"{p}:{p}" for p in (shared_root, *CONTAINER_HOST_MOUNTS))
    opts = [f"--container-image={enroot_image(image)}", f"--container-mounts={mounts}",
            f"--container-workdir={workdir}", "--no-container-mount-home"]
    names = sorted(set(env_names))
    if names:
        opts.append("--container-env=" + ",".join(names))
    return opts


def container_probe_argv(image: str, shared_root: str, probe: list[str], partition: str | None = None,
                         immediate_s: int = 60) -> list[str]:
    """The login-node command that asks ``image``'s interpreter the environment probe (pure):
    ``srun --nodes=1 --ntasks=1 --immediate=<s> [--partition=P] <pyxis options> python <probe[1:]>``,
    ``probe`` being :func:`hyperpod_lab.submit.envparity.probe_argv`'s list (its interpreter is
    replaced by :data:`CONTAINER_PYTHON`). ``--immediate``: a cluster with no free node refuses at
    once instead of queueing the probe. An argv list: each word reaches the remote shell quoted.
    Not yet run by the submission check (see docs/containers.md). Raises SpecError as
    :func:`pyxis_srun_opts`."""
    argv = ["srun", "--nodes=1", "--ntasks=1", f"--immediate={int(immediate_s)}"]
    if partition:
        argv.append(f"--partition={partition}")
    return argv + pyxis_srun_opts(image, shared_root, shared_root) + [CONTAINER_PYTHON, *probe[1:]]


def sbatch_quote(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line: sbatch's own parser (get_argument() in
    src/sbatch/opt.c) splits on blanks, takes ``"`` or ``'`` as grouping quotes, ``\\`` as an
    escape and an unquoted ``#`` as the start of a comment, so the value goes in double quotes
    with ``\\`` and ``"`` escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def slurm_filename(path: str) -> str:
    """``path`` as a literal in an sbatch filename pattern: ``%`` is a replacement symbol there
    (sbatch(1), "filename pattern"), ``%%`` the character itself."""
    return path.replace("%", "%%")


def exclusive_for(spec: JobSpec, gpus_per_node: int | None) -> bool:
    """``spec.exclusive``, or, unset, whether the nodes have GPUs (AWS's GPU training scripts
    all ask ``--exclusive``; a CPU job on a shared partition should not hold whole nodes)."""
    return bool(gpus_per_node) if spec.exclusive is None else bool(spec.exclusive)


def render_sbatch(spec: JobSpec, job_id: str, job_dir: str, python: str, shared_root: str,
                  partition: str | None = None, join_offset: int | None = None, join_nodes: int = 1,
                  gpus_per_node: int | None = None, efa: bool = False, container_image: str | None = None) -> str:
    """Render the batch script of ``spec`` (pure; golden-file tested).

    What it sets, and the source of each rule (tests/schedulers/test_slurm_render.py checks each one):

    * ``--cpus-per-task`` on ``#SBATCH`` *and* on ``srun``: Slurm 22.05 to 23.02 ``srun`` does
      not read ``SLURM_CPUS_PER_TASK`` (RELEASE_NOTES 22.05; 23.11 went back, and reads
      ``SRUN_CPUS_PER_TASK`` no more), so only the explicit option works on every release.
    * with GPUs (``gpus_per_node``): ``--gpus-per-node`` = processes per node (one GPU a
      rank), and the node health check expects that many (``--expect-gpus``: what the job
      asked for, which is what the step sees, not what the node has); ``--exclusive`` by
      default (:func:`exclusive_for`); ``--wait-all-nodes=1`` always, as AWS's multi-node
      scripts do (the step starts when every node has booted).
    * ``srun --label``: each line of output carries its task (node) number, as AWS's ``srun -l``.
    * HyperPod is detected when the job starts (``[ -d /opt/sagemaker_cluster ]``, the idiom of
      AWS's scripts) and then the step runs under ``srun --auto-resume=1``; ``--requeue`` with
      ``auto_resume`` either way (Slurm's own recovery of a lost allocation; HyperPod's
      auto-resume re-runs a failed step inside the allocation), ``--no-requeue`` without it.
    * each run of the training step has its own rendezvous id and port: the step computes them
      itself (``SLURM_RESTART_COUNT`` for a requeue, ``SLURM_STEP_ID`` and a per-node counter
      file ``runs/<restart>.<step>/node-<id>`` in the job directory for a re-run of the step by
      HyperPod's auto-resume, which changes neither ``SLURM_RESTART_COUNT`` nor the argv).
    * ``efa``: the ``FI_*``/NCCL variables of AWS's reference scripts (:data:`EFA_ENV`).
    * ``container_image``: every training ``srun`` runs in that image through pyxis
      (:func:`pyxis_srun_opts`), launched by the image's :data:`CONTAINER_PYTHON`; the
      supervisor, the Lighthouse and the health checks stay on the host (``python``).
    * paths in ``#SBATCH`` lines quoted (:func:`sbatch_quote`) and ``%`` escaped
      (:func:`slurm_filename`).

    Args:
        spec: a validated JobSpec.
        job_id: hyperpod-lab job id; job_dir: its directory on shared storage.
        python: interpreter on the nodes (with hyperpod-lab and torch installed).
        shared_root: the cluster's shared-storage root (exported to the job).
        partition: Slurm partition, or None for the cluster default.
        join_offset: checkpointless jobs only: render a second allocation of ``join_nodes``
            nodes that joins the running job as replica groups ``join_offset``,
            ``join_offset + 1``, ... (elastic scale-up); None renders the job itself.
        gpus_per_node: GPUs of each node of the partition (the profile's), or None/0.
        efa: the nodes have EFA devices (the profile's ``efa``).
        container_image: run the training steps in this image (pyxis/enroot), or None.

    Returns:
        The sbatch script text. Every user-supplied value appears shell-quoted. The job name
        is not in the script: it is passed to ``sbatch --job-name`` as an argv word.

    Raises:
        SpecError: a joining allocation of a job that is not checkpointless, more processes
            per node than the nodes have GPUs, or a container image pyxis cannot take
            (:func:`pyxis_srun_opts`).
    """
    paths, sh = JobPaths(job_dir), JobPaths("$JOB_DIR")  # sh: the same paths, as the script spells them
    script = paths.script(spec.script)
    el = spec.elastic
    nnodes = f"{el.min_nodes}:{el.max_nodes}" if el.enabled else str(spec.nodes)
    joining = join_offset is not None
    if joining and spec.resiliency.recovery != RECOVERY_CHECKPOINTLESS:
        raise SpecError("resiliency.recovery", "only a checkpointless job can take new nodes while it runs; "
                        "submit it with --recovery checkpointless")
    gpus = int(gpus_per_node or 0)
    if gpus and spec.procs_per_node > gpus:
        raise SpecError("procs_per_node", f"{spec.procs_per_node} processes per node, but the nodes have {gpus} GPUs "
                                          f"(one GPU a process); use --procs-per-node {gpus} or fewer")
    log = JobPaths(slurm_filename(job_dir)).slurm_log("join-%j" if joining else "%j")
    lines = [
        "#!/bin/bash",
        f"# Rendered by hyperpod-lab {__version__} for job {job_id}"
        + (f" (nodes joining as replica groups from {join_offset})" if joining else "")
        + ". Resubmit instead of editing.",
        f"#SBATCH --nodes={join_nodes if joining else spec.nodes + spec.resiliency.spares}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={spec.procs_per_node}",
    ]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={spec.procs_per_node}")
    if exclusive_for(spec, gpus):
        lines.append("#SBATCH --exclusive")
    lines += [
        "#SBATCH --wait-all-nodes=1",
        f"#SBATCH --output={sbatch_quote(log)}",
        "#SBATCH --open-mode=append",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if spec.time_limit_min:
        lines.append(f"#SBATCH --time={spec.time_limit_min}")
    # finds the job (and the allocations scale adds) in squeue: a submitter that died before
    # recording the Slurm id, a cancel that checks joins.json
    lines.append(f"#SBATCH --comment={sbatch_quote(COMMENT_PREFIX + job_id)}")
    if not joining or spec.resiliency.recovery == RECOVERY_CHECKPOINTLESS:
        # a lost node does not end the allocation: the supervisor places the steps again
        # (checkpointless: the other groups go on; restart: survivors and a spare, or a requeue)
        lines.append("#SBATCH --no-kill")
    if spec.resiliency.auto_resume and not joining:
        lines.append("#SBATCH --requeue")
    else:
        lines.append("#SBATCH --no-requeue")
    lines += [
        "set -uo pipefail",
        "umask 077  # what the job writes on shared storage is private to the user",
        f"JOB_DIR={_q(job_dir)}",
    ]
    if not joining:  # the job's own record of its Slurm id (see Scheduler.find_native_id)
        lines.append(f'echo "$SLURM_JOB_ID" > "{sh.native_id}"')
    lines += [
        f"export {ENV_JOB_ID}={_q(job_id)}",
        f'export {ENV_JOB_DIR}="$JOB_DIR"',
        f'export {ENV_SPEC}="{sh.spec}"',
        f"export {ENV_SHARED_ROOT}={_q(shared_root)}",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
        # torch 2.13: agents joining a c10d rendezvous hang unless each runs its own store
        "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
    ]
    if efa:
        lines += [f"export {k}={_q(v)}" for k, v in EFA_ENV.items()]
    for key in sorted(spec.env):
        lines.append(f"export {key}={_q(spec.env[key])}")
    lines += [
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head_addr=$(scontrol show node "$head_node" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        ': "${head_addr:=$head_node}"',
        "restart=${SLURM_RESTART_COUNT:-0}  # a requeue runs this script again with the count + 1",
        f'echo "hyperpod-lab: job ${ENV_JOB_ID} slurm $SLURM_JOB_ID restart $restart '
        'nodes $SLURM_JOB_NODELIST head $head_addr"',
    ]
    srun = ["srun", "--nodes=$SLURM_JOB_NUM_NODES", "--ntasks-per-node=1",
            f"--cpus-per-task={spec.procs_per_node}", "--kill-on-bad-exit=0", "--label"]
    step_python = python
    if container_image:
        # shell-quoted words: srun's own for a joining allocation, and --srun-opt=<word> for the supervisor
        srun += [_q(o) for o in pyxis_srun_opts(container_image, shared_root, job_dir,
                                                 [*spec.env, *spec.secret_env])]
        step_python = CONTAINER_PYTHON
    if spec.resiliency.auto_resume:
        # HyperPod's auto-resume, on HyperPod nodes only: decided where the job runs, as AWS's scripts do
        lines += ['auto_resume=""',
                  f'if [ -d {HYPERPOD_MARKER} ]; then',
                  '    echo "hyperpod-lab: HyperPod cluster: srun --auto-resume=1"',
                  '    auto_resume="--auto-resume=1"',
                  'fi']
        srun.append("$auto_resume")
    launch_opts = dict(nproc_per_node=spec.procs_per_node, max_restarts=effective_restarts(spec.resiliency),
                       log_dir=f'"{sh.torchrun_logs}"', quote=_q)
    checkpointless = spec.resiliency.recovery == RECOVERY_CHECKPOINTLESS
    if checkpointless:
        # one data-parallel replica group per node (its own torchrun), one torchft Lighthouse per job
        min_replicas = el.min_nodes if el.enabled else 1
        launch = launcher_argv(step_python, script, spec.args, standalone=True, monitor_interval=0.1, **launch_opts)
        if joining:
            lines += [f"export {ENV_REPLICA_GROUP}={SLURM_REPLICA_GROUP}",
                      f"export {ENV_REPLICA_GROUP_OFFSET}={int(join_offset or 0)}",
                      " ".join(srun) + " \\\n    " + " ".join(launch), "rc=$?"]
        else:
            lines += [
                # the previous run's Lighthouse (before a requeue) died with it: no group may read
                # its address while this run's Lighthouse starts
                f'rm -f "{sh.lighthouse}"',
                " ".join(lighthouse_argv(_q(python), '"$JOB_DIR"', min_replicas=min_replicas, host='"$head_addr"'))
                + f' >> "{sh.lighthouse_log}" 2>&1 &',
                "lighthouse_pid=$!",
                f"export {ENV_REPLICA_GROUPS}={spec.nodes}",
                f"export {ENV_REPLICA_GROUP_OFFSET}=0",
            ]
    else:
        launch = launcher_argv(step_python, script, spec.args, nnodes=nnodes,
                               rdzv=["--rdzv-backend=c10d", '--rdzv-endpoint="$head_addr:$rdzv_port"',
                                     '--rdzv-id="$SLURM_JOB_ID.$run"', "--rdzv-conf=join_timeout=120"],
                               **launch_opts)
        # {head_addr}: the supervisor puts the first training node's address there
        launch = ["bash", "-c", _q(_step_script(launch)), "hyperpod-lab-step", "{head_addr}", '"$restart"']
    if not joining:
        sup = _supervisor_argv(spec, job_id, python, launch, gpus, srun[3:])
        lines.append(" ".join(sup[:3]) + " \\\n    " + " \\\n    ".join(sup[3:]) + "\nrc=$?")
        if checkpointless:
            lines.append('kill "$lighthouse_pid" 2>/dev/null')
    lines.append('echo "hyperpod-lab: step exited with $rc"')
    lines.append("exit $rc")
    return "\n".join(lines) + "\n"


def _supervisor_argv(spec: JobSpec, job_id: str, python: str, launch: list[str], gpus: int,
                     srun_opts: list[str]) -> list[str]:
    """The batch script's call of :mod:`hyperpod_lab.node.supervisor`, which places the
    training steps (``launch``: already shell-quoted words) on the allocation's nodes (pure)."""
    res = spec.resiliency
    argv = [_q(python), "-m", "hyperpod_lab.node.supervisor", '--job-dir="$JOB_DIR"', f"--job-id={_q(job_id)}",
            f"--nodes={spec.nodes}", f"--spares={res.spares}", f"--mode={res.recovery}",
            f"--procs-per-node={spec.procs_per_node}", f"--python={_q(python)}"]
    if res.health_checks:
        # the GPUs the job asked for (--gpus-per-node = procs_per_node), not the node's count
        expect = spec.procs_per_node if gpus else 0
        argv += ["--health-checks", f"--health-arg=--expect-gpus={expect}",
                 f"--health-arg=--expect-version={_q(__version__)}"]
    if res.auto_resume:
        argv.append("--requeue")
    argv += [f"--srun-opt={o}" for o in srun_opts if not o.startswith("$")]
    if "$auto_resume" in srun_opts:
        argv.append("${auto_resume:+--srun-opt=$auto_resume}")
    return argv + ["--", " ".join(launch)]


def _step_script(launch: list[str]) -> str:
    """What each task of the training step runs (``bash -c``, with the head node's address and
    the restart count as ``$1``, ``$2``): its run's rendezvous id and port, then the launcher.

    A run is ``<restart>.<step id>.<attempt>``. A requeue starts the batch script again with
    ``SLURM_RESTART_COUNT`` + 1; HyperPod's auto-resume re-runs the step with the same argv and
    the same ``SLURM_RESTART_COUNT``, so the step counts its own starts: each node (task) keeps
    a counter file ``runs/<restart>.<step id>/node-<SLURM_NODEID>`` in the job directory (one
    writer per file), and every node of a re-run reads the same count. A process left over
    from an earlier run (a node marked DOWN that still runs) can then neither join the new
    rendezvous nor hold its port.
    """
    runs = JobPaths("$JOB_DIR").step_run("$restart", "$step")
    return "\n".join([
        f'JOB_DIR="${ENV_JOB_DIR}" head_addr=$1 restart=$2 step=${{SLURM_STEP_ID:-0}}',
        f'mkdir -p "{runs}"',
        f'counter="{runs}/node-${{SLURM_NODEID:-0}}"',
        'attempt=$(cat "$counter" 2>/dev/null || echo 0)',
        'echo $(( attempt + 1 )) > "$counter"',
        'run=$restart.$step.$attempt',
        f'rdzv_port=$(( {RDZV_PORT_BASE} + (SLURM_JOB_ID + {RDZV_PORT_RUN_STRIDE} * '
        f'(restart * 1009 + step * 31 + attempt)) % {RDZV_PORT_SPAN} ))',
        'echo "hyperpod-lab: run $run rendezvous $head_addr:$rdzv_port"',
        "exec " + " ".join(launch),
    ])


def sbatch_argv(name: str, job_dir: str) -> list[str]:
    """The sbatch command for a staged job (the name travels as one argv word)."""
    return ["sbatch", "--parsable", f"--job-name={name}", f"--chdir={job_dir}",
            JobPaths(job_dir).sbatch]


def parse_sbatch(stdout: str) -> str:
    """Job id from ``sbatch --parsable`` output (``"123"`` or ``"123;cluster"``).

    Raises HyperPodLabError if there is none.
    """
    for line in stdout.strip().splitlines()[::-1]:
        m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", line)
        if m:
            return m.group(1)
    raise HyperPodLabError(f"sbatch printed no job id: {stdout.strip()[:500]!r}")


# Every job state squeue's ``%T`` and sacct's ``State`` print, Slurm 22.05 to 25.11 (the
# squeue(1) and sacct(1) JOB STATE CODES sections; job_state_string() in
# src/common/slurm_protocol_defs.c, which adds EXPEDITING in 25.11; the "Job State Codes" page
# doc/html/job_state_codes.shtml for the flags). A flag is printed instead of the base state.
_SLURM_TO_STATUS = {
    # waiting to start (again)
    "PENDING": JobStatus.PENDING, "CONFIGURING": JobStatus.PENDING, "REQUEUED": JobStatus.PENDING,
    "REQUEUE_HOLD": JobStatus.PENDING, "REQUEUE_FED": JobStatus.PENDING, "RESV_DEL_HOLD": JobStatus.PENDING,
    "EXPEDITING": JobStatus.PENDING,  # 25.11: requeued, "immediately eligible ... highest possible priority"
    "POWER_UP_NODE": JobStatus.PENDING, "LAUNCH_FAILED": JobStatus.PENDING,  # flags: allocated, not started
    # SPECIAL_EXIT: "The job was requeued in a special state" (same as REQUEUE_HOLD, set by
    # EpilogSlurmctld for a chosen exit value): held, not ended; `scontrol release` runs it again
    "SPECIAL_EXIT": JobStatus.PENDING,
    # holding its allocation
    "SUSPENDED": JobStatus.RUNNING, "RUNNING": JobStatus.RUNNING, "COMPLETING": JobStatus.RUNNING,
    "STAGE_OUT": JobStatus.RUNNING, "SIGNALING": JobStatus.RUNNING, "RESIZING": JobStatus.RUNNING,
    "STOPPED": JobStatus.RUNNING, "UPDATE_DB": JobStatus.RUNNING,
    # ended
    "COMPLETED": JobStatus.COMPLETED, "CANCELLED": JobStatus.CANCELLED,
    "FAILED": JobStatus.FAILED, "TIMEOUT": JobStatus.FAILED, "NODE_FAIL": JobStatus.FAILED,
    "OUT_OF_MEMORY": JobStatus.FAILED, "BOOT_FAIL": JobStatus.FAILED, "DEADLINE": JobStatus.FAILED,
    "PREEMPTED": JobStatus.FAILED, "RECONFIG_FAIL": JobStatus.FAILED,
    # REVOKED: "Sibling was removed from cluster due to other cluster starting the job" (a
    # federation): the job did not end, it runs on another cluster; this cluster cannot say how
    # it goes, so UNKNOWN (not terminal: the watcher keeps asking), with the reason spelled out
    "REVOKED": JobStatus.UNKNOWN,
}

STATE_NOTES = {
    "REVOKED": "REVOKED: another cluster of the federation started the job (ask that cluster)",
    "SPECIAL_EXIT": "SPECIAL_EXIT: requeued and held for its exit code; 'scontrol release' runs it again",
    "REQUEUE_HOLD": "REQUEUE_HOLD: requeued and held; 'scontrol release' runs it again",
}
"""What a state means where its name does not say it (added to the reason the parsers return)."""

REASON_NOTES = {
    "PartitionConfig": "no node of the partition has what the job asks (e.g. more CPUs a node than its nodes "
                       "have: a job takes one CPU a process, --procs-per-node); it will not start: cancel it and "
                       "submit with fewer processes a node or to another partition",
    "BadConstraints": "the job's constraints can not be satisfied; it will not start: cancel it and submit "
                      "without them",
    "PartitionNodeLimit": "the job asks more nodes than its partition allows, or the nodes it needs are DOWN or "
                          "DRAINED: fewer --nodes, another partition, or ask an administrator",
    "PartitionTimeLimit": "the job's time limit exceeds its partition's: a shorter --time or another partition",
}
"""Pending reasons a job does not get past by waiting (squeue(1), JOB REASON CODES: "BadConstraints
The job's constraints can not be satisfied", "PartitionNodeLimit The number of nodes required by
this job is outside of its partition's current limits. Can also indicate that required nodes are
DOWN or DRAINED", "PartitionTimeLimit The job's time limit exceeds its partition's current time
limit"; ``PartitionConfig`` is slurm's WAIT_PART_CONFIG, "Requested partition configuration not
available now", what a job asking 8 CPUs a node of 2-CPU nodes shows), and what to do: added
to the reason the parsers return."""


def slurm_state(text: str) -> JobStatus:
    """Map a Slurm state (``"CANCELLED by 0"``, ``"RUNNING"``; the two-letter codes such as
    ``"CD"`` are not accepted) to JobStatus; an unknown word is UNKNOWN."""
    word = (text or "").strip().split(" ")[0].rstrip("+").upper()
    return _SLURM_TO_STATUS.get(word, JobStatus.UNKNOWN)


def _state_word(text: str) -> str:
    return (text or "").strip().split(" ")[0].rstrip("+").upper()


_JOB_ID = re.compile(r"(\d+)(?:_(?:\d+|\[[^\]]*\])|\+\d+)?")


def _job_row_id(jobid: str) -> tuple[str, str] | None:
    """``(id as printed, base id)`` of a job row: ``123``, an array task ``123_4`` (or the
    pending rest ``123_[5-9%2]``) and a heterogeneous component ``123+0`` all belong to job
    ``123`` (squeue(1) ``%i``; sacct(1) ``JobID``: ``<jobid>_<taskid>``, ``<jobid>+<offset>``);
    None for a step row (``123.batch``, ``123+0.0``) or a line that is not a job id."""
    m = _JOB_ID.fullmatch(jobid.strip())
    return (m.group(0), m.group(1)) if m else None


def _merge_base(rows: dict, base_of: dict[str, str], status_of) -> None:
    """Give each base id (``123``) of array tasks / het components an entry of its own: the
    first component still going, else the first that did not complete, else any."""
    groups: dict[str, list[str]] = {}
    for jid, base in base_of.items():
        if jid != base:
            groups.setdefault(base, []).append(jid)
    for base, members in groups.items():
        if base in rows:
            continue
        live = [m for m in members if not status_of(rows[m]).is_terminal()]
        bad = [m for m in members if status_of(rows[m]) != JobStatus.COMPLETED]
        rows[base] = rows[(live or bad or members)[0]]


def parse_squeue(stdout: str) -> dict[str, tuple[JobStatus, str]]:
    """Parse ``squeue -h -o '%i|%T|%r'`` into ``{job id: (status, reason)}``.

    The reason is the rest of the line, ``|`` included (an administrator's reason is free
    text); ``None`` and ``(null)`` (squeue(1): printed where a job has no reason) are no reason.
    A line without the three fields (``%i`` and ``%T`` never hold ``|``) is skipped. Array tasks and heterogeneous components are kept under their own ids
    (``123_4``, ``123+0``) and summed up under the base id ``123`` (see :func:`_merge_base`),
    exactly as :func:`parse_sacct` does.
    """
    out: dict[str, tuple[JobStatus, str]] = {}
    base_of: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|", 2)
        ids = _job_row_id(parts[0]) if len(parts) == 3 else None
        if not ids:
            continue
        reason = parts[2].strip() if parts[2].strip() not in ("None", "(null)", "") else ""
        hint = REASON_NOTES.get(reason)
        if hint:
            reason = f"{reason}: {hint}"
        note = STATE_NOTES.get(_state_word(parts[1]))
        if note:
            reason = f"{note}; {reason}" if reason else note
        out[ids[0]] = (slurm_state(parts[1]), reason)
        base_of[ids[0]] = ids[1]
    _merge_base(out, base_of, lambda row: row[0])
    return out


SINFO_ARGV = ["sinfo", "-N", "-h", "-o", "%N|%t|%c|%P"]


def parse_sinfo(stdout: str) -> list[dict]:
    """Parse ``sinfo -N -h -o '%N|%t|%c|%P'`` (one line per node and partition) into
    ``[{"name", "state", "cpus", "partitions"}]``, one entry per node; the default
    partition's ``*`` is dropped and a state's flag suffix (``*``, ``~``, ``#``...) kept."""
    nodes: dict[str, dict] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        name, state, cpus, part = parts
        node = nodes.setdefault(name, {"name": name, "state": state,
                                       "cpus": int(cpus) if cpus.isdigit() else None, "partitions": []})
        part = part.rstrip("*")
        if part and part not in node["partitions"]:
            node["partitions"].append(part)
    return list(nodes.values())


# ---- the queue around a job (issue 29 item 4): every user's jobs, the nodes, the partitions ----

#: squeue's fields for :func:`parse_queue`, in ``-o`` order after the row marker; squeue(1)
#: "-o <output_format>": %i "Job or job step id" (``<base>_<index>`` for an array task), %T "Job
#: state in extended form", %P "Partition of the job" (one partition a row with ``-P``), %Q "Priority
#: of the job (generally a very large unsigned integer)", %D "Number of nodes allocated to the job
#: or the minimum number of nodes required by a pending job", %u "User name for a job", %M "Time
#: used by the job" (``[days-][hours:]minutes:seconds``), %l "Time limit of the job" (or
#: ``UNLIMITED``/``NOT_SET``), %S "Actual or expected start time" (``N/A`` when not known), %N
#: "List of nodes allocated to the job", %r "The reason a job is in its current state" (JOB REASON
#: CODES, printed by slurmctld), %j "Job or job step name" -- the user's free text, so last: it
#: may hold ``|``, spaces and newlines (sbatch --job-name takes them; seen on 22.05.8).
QUEUE_FIELDS = (("i", "id"), ("T", "state"), ("P", "partition"), ("Q", "priority"), ("D", "nodes"),
                ("u", "user"), ("M", "time"), ("l", "time_limit"), ("S", "start"), ("N", "nodelist"),
                ("r", "reason"), ("j", "name"))

#: sinfo's fields for :func:`parse_nodes`, in ``-o`` order after the row marker (``-N``: one line
#: per node and partition); sinfo(1) "-o <output_format>": %N "List of node names", %P "Partition
#: name followed by "*" for the default partition", %a "State/availability of a partition", %l
#: "Maximum time for any job", %T "State of nodes, extended form" (a flag suffix such as ``*``
#: "not responding" or ``~`` "powered off": NODE STATE CODES), %c "Number of CPUs per node", %C
#: "Number of CPUs by state in the format allocated/idle/other/total", %G "Generic resources (gres)
#: associated with the nodes", %H "the timestamp of the reason a node is unavailable", %E "The
#: reason a node is unavailable (down, drained, or draining states)" -- an operator's free text
#: (``scontrol update ... Reason=``), so last.
NODE_FIELDS = (("N", "name"), ("P", "partition"), ("a", "avail"), ("l", "time_limit"), ("T", "state"),
               ("c", "cpus"), ("C", "cpu_states"), ("G", "gres"), ("H", "reason_time"), ("E", "reason"))

#: node state groups the queue view counts (sinfo(1) NODE STATE CODES, base state without its flag)
NODE_GROUPS = {"idle": "idle", "allocated": "alloc", "allocated+": "alloc", "completing": "alloc",
               "mixed": "mixed", "down": "down", "drained": "drain", "draining": "drain",
               "fail": "down", "failing": "drain"}
#: the flag characters sinfo(1) may put after a node state (NODE STATE CODES)
_NODE_FLAGS = "*~#!%$@^-"


def queue_marker() -> str:
    """A fresh row marker for one :func:`queue_argv`/:func:`nodes_argv` call: a job name or node
    reason set before the call cannot start a line with it, so a line that does not start with it
    continues the previous row's free-text field (a name holding a newline) instead of forging a row."""
    import secrets

    return "hpl" + secrets.token_hex(8)


def queue_argv(marker: str) -> list[str]:
    """``squeue`` of every user's pending, running and completing jobs (squeue(1) ``-t``: "If no state
    is specified then pending, running, and completing jobs are reported"), ``-h`` no header,
    ``-P`` "For pending jobs submitted to multiple partitions, list the job once per partition" with
    ``--sort=-p,i`` ("a list of pending jobs in the same order considered for scheduling by Slurm",
    squeue(1) ``-P``): decreasing priority, then job id. Each row starts with ``marker``."""
    return ["squeue", "-h", "-P", "--sort=-p,i", "-o", "|".join([marker] + ["%" + c for c, _ in QUEUE_FIELDS])]


def nodes_argv(marker: str) -> list[str]:
    """``sinfo -N -h`` (one line per node and partition, no header) with :data:`NODE_FIELDS`, each
    row starting with ``marker``."""
    return ["sinfo", "-N", "-h", "-o", "|".join([marker] + ["%" + c for c, _ in NODE_FIELDS])]


def _marked_rows(stdout: str, marker: str, keys: tuple) -> list[dict[str, str]]:
    """Rows of ``stdout`` whose lines start with ``marker|``, split into ``keys``: every field but the
    last holds no ``|``, the last takes the rest of the line and every following line without the
    marker (joined with ``\\n``: a free-text field holding a newline). Text before the first row
    and a row with too few fields are dropped."""
    rows: list[list[str]] = []
    head = marker + "|"
    text = stdout[:-1] if stdout.endswith("\n") else stdout  # the newline after the last row
    for line in text.split("\n"):
        if line.startswith(head):
            rows.append(line[len(head):].split("|", len(keys) - 1))
        elif rows:
            rows[-1][-1] += "\n" + line
    return [dict(zip(keys, parts)) for parts in rows if len(parts) == len(keys)]


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _none_word(text: str, *words: str) -> str | None:
    """``text``, or None when it is one of Slurm's words for nothing."""
    return None if text.strip() in ("", "(null)", *words) else text


def parse_queue(stdout: str, marker: str) -> list[dict]:
    """Parse :func:`queue_argv`'s output into one dict per row, in squeue's order.

    Returns:
        ``[{"id", "state", "status", "partition", "priority" (int or None), "nodes" (int or None),
        "user", "time", "time_limit", "start" (None for ``N/A``), "nodelist" (None when empty),
        "reason" (None for ``None``), "name", "position"}]``; ``status`` is the
        :class:`JobStatus` value of ``state`` (:func:`slurm_state`); ``position`` is a pending row's
        1-based place among the pending rows of its partition in squeue's order (decreasing priority,
        then job id, as :func:`queue_argv` sorts), None for a job that is not pending. ``name`` is
        the job name exactly as squeue printed it (untrusted text: ``|``, spaces, newlines, markup).
    """
    keys = tuple(k for _, k in QUEUE_FIELDS)
    seen: dict[str, int] = {}
    jobs = []
    for row in _marked_rows(stdout, marker, keys):
        status = slurm_state(row["state"])
        pos = None
        if status == JobStatus.PENDING:
            pos = seen[row["partition"]] = seen.get(row["partition"], 0) + 1
        jobs.append({**row, "status": status.value, "priority": _int_or_none(row["priority"]),
                     "nodes": _int_or_none(row["nodes"]), "start": _none_word(row["start"], "N/A"),
                     "nodelist": _none_word(row["nodelist"]), "reason": _none_word(row["reason"], "None"),
                     "position": pos})
    return jobs


def node_group(state: str) -> str:
    """The queue view's group of a sinfo ``%T`` state (``idle``, ``alloc``, ``mixed``, ``down``,
    ``drain`` or ``other``), its flag suffix ignored; a node not responding (``*``) that is not
    already down or drained counts as ``down``."""
    word = state.strip().lower()
    base = word.rstrip(_NODE_FLAGS) if word not in NODE_GROUPS else word
    group = NODE_GROUPS.get(base, "other")
    if word.endswith("*") and group not in ("down", "drain"):
        return "down"
    return group


def parse_nodes(stdout: str, marker: str) -> tuple[list[dict], list[dict]]:
    """Parse :func:`nodes_argv`'s output into ``(nodes, partitions)``.

    Returns:
        nodes: ``[{"name", "state" (sinfo's %T, flags kept), "group" (:func:`node_group`), "cpus"
        (int or None), "cpus_alloc", "cpus_idle" (ints or None, from %C), "gres" (None for
        ``(null)``), "reason" (None for ``none``), "reason_time" (None for ``Unknown``),
        "partitions"}]``, one per node in sinfo's order; partitions: ``[{"name", "default" (the
        ``*`` of %P), "avail", "time_limit", "nodes" (names), "counts" ({group: nodes})}]``.
        ``reason`` is an operator's free text, exactly as sinfo printed it (untrusted).
    """
    keys = tuple(k for _, k in NODE_FIELDS)
    nodes: dict[str, dict] = {}
    parts: dict[str, dict] = {}
    for row in _marked_rows(stdout, marker, keys):
        cpu = [_int_or_none(x) for x in row["cpu_states"].split("/")]
        cpu += [None] * (4 - len(cpu))
        node = nodes.setdefault(row["name"], {
            "name": row["name"], "state": row["state"], "group": node_group(row["state"]),
            "cpus": _int_or_none(row["cpus"]), "cpus_alloc": cpu[0], "cpus_idle": cpu[1],
            "gres": _none_word(row["gres"]), "reason": _none_word(row["reason"], "none"),
            "reason_time": _none_word(row["reason_time"], "Unknown"), "partitions": []})
        name = row["partition"].rstrip("*")
        if not name:
            continue
        if name not in node["partitions"]:
            node["partitions"].append(name)
        part = parts.setdefault(name, {"name": name, "default": row["partition"].endswith("*"),
                                       "avail": row["avail"], "time_limit": row["time_limit"],
                                       "nodes": [], "counts": {}})
        if node["name"] not in part["nodes"]:
            part["nodes"].append(node["name"])
            part["counts"][node["group"]] = part["counts"].get(node["group"], 0) + 1
    return list(nodes.values()), list(parts.values())


def parse_exit_code(text: str) -> int | None:
    """sacct's ``EXIT:SIGNAL`` into one code (a signal N becomes 128+N, as shells report it)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not m:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return 128 + sig if sig else code


SACCT_FIELDS = ("JobID", "State", "ExitCode")
"""The fields :func:`parse_sacct` reads, in ``-o`` order (none of them can hold ``|``)."""


def parse_sacct(stdout: str) -> dict[str, tuple[JobStatus, int | None, str]]:
    """Parse ``sacct -n -P -X -o JobID,State,ExitCode`` into ``{job id: (status, exit, state)}``.

    Both parsable forms are read (sacct(1): "-p, --parsable: output will be '|' delimited with a
    '|' at the end"; "-P, --parsable2: output will be '|' delimited without a '|' at the end"):
    a line has exactly the three fields of :data:`SACCT_FIELDS`, plus one empty field after a
    trailing ``|``; any other line is skipped, never read with its fields shifted. An empty or
    malformed ``ExitCode`` is None.

    With several rows for one job (requeues), the last row wins. Step rows (``123.batch``) are
    skipped; array tasks and heterogeneous components (``123_4``, ``123+0``) are kept under
    their own ids and summed up under the base id, as :func:`parse_squeue` does. ``state`` is
    sacct's text, with the meaning of ``REVOKED`` and ``SPECIAL_EXIT`` added (:data:`STATE_NOTES`).
    """
    out: dict[str, tuple[JobStatus, int | None, str]] = {}
    base_of: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == len(SACCT_FIELDS) + 1 and parts[-1] == "":  # --parsable's trailing '|'
            parts.pop()
        ids = _job_row_id(parts[0]) if len(parts) == len(SACCT_FIELDS) else None
        if not ids:
            continue
        state = parts[1].strip()
        note = STATE_NOTES.get(_state_word(state))
        out[ids[0]] = (slurm_state(state), parse_exit_code(parts[2]), f"{state} ({note})" if note else state)
        base_of[ids[0]] = ids[1]
    _merge_base(out, base_of, lambda row: row[0])
    return out


class SlurmScheduler(Scheduler):
    """Slurm over SSH (or over LocalRemote in tests of the login node itself)."""

    #: a Slurm job id as hyperpod-lab's jobs have them: sbatch(1) ``--parsable`` prints "the job id
    #: number" (``<id>[;<cluster>]``, the cluster part dropped by :func:`parse_sbatch`), the batch
    #: script writes ``$SLURM_JOB_ID``; never an array task (``123_4``, ``123_[1-3]``) or a het
    #: component (``123+0``): hyperpod-lab submits neither. Digits, no leading zero, at most 10.
    NATIVE_ID = re.compile(r"[1-9][0-9]{0,9}")
    NATIVE_ID_FORM = "a Slurm job id: digits only"

    def _id(self, rec) -> str:
        """``rec.native_id`` checked (:meth:`native_id`) before it reaches a command. Raises JobStateError."""
        return self.native_id(rec.native_id, f"the job record of {rec.job_id} (native_id)")

    def _render(self, spec: JobSpec, job_id: str, **join) -> str:
        """The batch script for this cluster (HyperPod is detected by the script itself, on the
        nodes, when it starts: nothing is asked of the login node here)."""
        return render_sbatch(spec, job_id, join.pop("job_dir", None) or self.job_dir(job_id), self.profile.python,
                             self.profile.shared_root, partition=spec.partition or self.profile.defaults.partition,
                             gpus_per_node=self.profile.gpus_per_node, efa=self.profile.efa,
                             container_image=spec.container_image or self.profile.container_image, **join)

    def render(self, spec, job_id):
        text = self._render(spec, job_id)
        cmd = shlex.join(sbatch_argv(spec.name, self.job_dir(job_id)))
        return f"# submit with: {cmd}\n{text}"

    def _sbatch(self, argv: list[str], secrets: dict[str, str]) -> str:
        """Run sbatch with ``SLURM_UMASK=0077`` (the job's output files private to the user; see
        sbatch(1), INPUT ENVIRONMENT VARIABLES); ``secrets`` go to its environment through
        standard input (:mod:`hyperpod_lab.envexec`, run as ``python -c <its source>``: nothing
        of this package is needed on the login node), and sbatch's ``--export=ALL`` hands them
        to the job. A submit stages and runs sbatch in one command instead (:meth:`submit_with_event`)."""
        if secrets:
            res = self.remote.run([*envexec.program_argv(self.profile.python), *argv], timeout_s=60,
                                  input=json.dumps({**secrets, "SLURM_UMASK": SLURM_UMASK}).encode())
        else:
            res = self.remote.run(["env", f"SLURM_UMASK={SLURM_UMASK}", *argv], timeout_s=60)
        return parse_sbatch(res.stdout)

    def submit(self, spec, job_id, script_bytes, secrets=None):
        return self.submit_with_event(spec, job_id, script_bytes, secrets, None)[0]

    def submit_with_event(self, spec, job_id, script_bytes, secrets, event):
        """Stage and submit in one command on the login node (``Remote.stage_and_run``: the script,
        ``spec.json``, ``checkpoint.key`` and the rendered ``job.sbatch`` travel on its standard
        input with the secrets; in local-mount mode they are written here first), ``event``
        appended there once sbatch printed the job id. No SFTP. Returns ``(job id, whether the
        event was appended)``."""
        if spec.partition is None:  # the profile's default partition, recorded with the job
            spec.partition = self.profile.defaults.partition
        if spec.container_image is None:  # the profile's image, recorded with the job (a scale-up renders the same)
            spec.container_image = self.profile.container_image
        plan = self.staging(spec, job_id, script_bytes)
        plan.files.append(StagedFile(posixpath.relpath(JobPaths(plan.folder).sbatch, plan.folder),
                                     self._render(spec, job_id).encode(), 0o700))
        record = None
        if event is not None:
            record = {"path": posixpath.relpath(JobPaths(plan.folder).event_file(event.writer), plan.folder),
                      "record": json.loads(event.to_json())}
        # one command: staging, sbatch (SLURM_UMASK and the secrets on its standard input, as
        # _sbatch), the job id, the event (Remote.stage_and_run)
        res, written = self.remote.stage_and_run(plan, sbatch_argv(spec.name, plan.folder),
                                                 {**(secrets or {}), "SLURM_UMASK": SLURM_UMASK},
                                                 self.profile.python, event=record, timeout_s=60)
        return parse_sbatch(res.stdout), written

    def poll(self, records):
        bad: dict[str, str] = {}
        for r in records:
            try:
                self._id(r)
            except JobStateError as e:
                bad[r.job_id] = str(e)
        ids = [r.native_id.strip() for r in records if r.job_id not in bad]
        if not ids:
            return {jid: (JobStatus.UNKNOWN, None, why) for jid, why in bad.items()}
        joined = ",".join(ids)
        sq = self.remote.run(["squeue", "-h", "--states=all", "-o", "%i|%T|%r", "-j", joined], check=False,
                             idempotent=True)
        live = parse_squeue(sq.stdout) if sq.exit_status == 0 else {}
        need = [i for i in ids if i not in live or live[i][0].is_terminal()]
        acct: dict[str, tuple[JobStatus, int | None, str]] = {}
        if need:
            sa = self.remote.run(["sacct", "-n", "-P", "-X", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(need)],
                                 check=False, idempotent=True)
            if sa.exit_status == 0:
                acct = parse_sacct(sa.stdout)
        out = {}
        for rec in records:
            nid = rec.native_id.strip() if isinstance(rec.native_id, str) else rec.native_id
            if rec.job_id in bad:  # never passed to squeue/sacct; the record stays as it was
                out[rec.job_id] = (JobStatus.UNKNOWN, None, bad[rec.job_id])
            elif nid in acct and (nid not in live or live[nid][0].is_terminal()):
                st, code, raw = acct[nid]
                out[rec.job_id] = (st, code, raw)
            elif nid in live:
                st, reason = live[nid]
                out[rec.job_id] = (st, None, reason or None)
            else:
                out[rec.job_id] = (JobStatus.UNKNOWN, None, "not in squeue or sacct")
        return out

    def find_native_id(self, rec):
        """The job's own record (it started), else squeue's job with the job's ``--comment``
        among those of its name (pending, or finished within MinJobAge).

        Raises:
            JobStateError: the job's ``native_id`` file holds something that is not a Slurm job id
                (:meth:`native_id`) and squeue does not show the job either.
        """
        bad = None
        try:
            found = super().find_native_id(rec)
        except JobStateError as e:  # not ours: ask squeue, which knows the job by its --comment
            found, bad = None, e
        if found:
            return found
        res = self.remote.run(["squeue", "-h", "--states=all", f"--name={rec.name}", "-o", "%i|%k"], check=False)
        for line in res.stdout.splitlines():
            jid, _, comment = line.strip().partition("|")
            if comment == COMMENT_PREFIX + rec.job_id and self.NATIVE_ID.fullmatch(jid):
                return jid
        if bad is not None:
            raise bad
        return None

    def health(self):
        """The nodes as ``sinfo -N`` reports them (one command over the remote seam); see
        :meth:`Scheduler.health`. Raises ClusterUnreachable, HostKeyError, RemoteCommandError."""
        res = self.remote.run(SINFO_ARGV, check=True, timeout_s=30, idempotent=True)
        return {"state": "up", "error": None, "nodes": parse_sinfo(res.stdout)}

    def queue_snapshot(self):
        """The queue around the jobs: one ``squeue`` of every user's jobs (:func:`queue_argv`) and one
        ``sinfo`` of the nodes (:func:`nodes_argv`) over the remote seam, each with a fresh row marker.
        See :meth:`Scheduler.queue_snapshot`. Raises ClusterUnreachable, HostKeyError,
        RemoteCommandError (squeue or sinfo exited non-zero)."""
        marker = queue_marker()
        sq = self.remote.run(queue_argv(marker), check=True, timeout_s=30, idempotent=True)
        si = self.remote.run(nodes_argv(marker), check=True, timeout_s=30, idempotent=True)
        nodes, partitions = parse_nodes(si.stdout, marker)
        return {"jobs": parse_queue(sq.stdout, marker), "nodes": nodes, "partitions": partitions,
                "user": self.profile.user}

    def cancel(self, rec):
        """scancel the job and the allocations ``scale`` added; an id from ``joins.json`` is
        cancelled only if squeue shows it with this job's ``--comment`` (the file could name
        any job of the user)."""
        own = self._id(rec)
        joins = [str(j.get("native_id", "")) for j in self.joins(rec) if self.NATIVE_ID.fullmatch(str(j.get("native_id", "")))]
        ours = []
        if joins:
            res = self.remote.run(["squeue", "-h", "--states=all", "-o", "%i|%k", "-j", ",".join(joins)], check=False)
            for line in res.stdout.splitlines():
                jid, _, comment = line.strip().partition("|")
                if jid in joins and comment == COMMENT_PREFIX + rec.job_id:
                    ours.append(jid)
        self.remote.run(["scancel", own, *ours])

    def _start_join(self, rec, spec, offset, add_nodes, index, secrets):
        """A second allocation of ``add_nodes`` nodes joining the job's Lighthouse."""
        text = self._render(spec, rec.job_id, job_dir=rec.job_dir, join_offset=offset, join_nodes=add_nodes)
        path = JobPaths(rec.job_dir).join_sbatch(index)
        self.remote.write_bytes(path, text.encode(), mode=0o700)
        argv = sbatch_argv(spec.name, rec.job_dir)
        argv[-1] = path
        return self._sbatch(argv, secrets)

    def log_range(self, rec, rank=None, offset=None, length=None):
        """A byte range of ``slurm-<id>.out`` (or of one rank's log): one bounded SFTP read."""
        if rank is not None:
            return self.rank_log(rec, rank, offset, length)
        path = JobPaths(rec.job_dir).slurm_log(self._id(rec))
        try:
            return read_log_range(self.remote, path, offset, length)
        except FileNotFoundError:
            return LogChunk("", 0, 0, 0)

    def _kill_rank(self, rec, rank):
        """``inject-fault --kind kill``: SIGKILL rank ``rank``'s pid (from ``ranks/rank-R.json``)
        on its node, through ``srun --overlap`` into the job's allocation. Raises JobStateError."""
        return self._signal_rank(rec, rank, "KILL", "kill")

    def _stop_rank(self, rec, rank):
        """``inject-fault --kind hang``: SIGSTOP rank ``rank``'s pid on its node (as
        :meth:`_kill_rank`); the launch agent's watchdog must catch it. Returns the rank info plus
        ``how``. Raises JobStateError."""
        info = self._signal_rank(rec, rank, "STOP", "stop")
        return {**info, "how": f"SIGSTOP to pid {info.get('pid')} on {info['node']}"}

    def _signal_rank(self, rec, rank, sig: str, verb: str) -> dict:
        info = self.rank_info(rec, rank)
        # the check runs on the rank's node, beside the process (see hyperpod_lab.procs)
        argv = ["srun", f"--jobid={self._id(rec)}", "--overlap", "--nodes=1", "--ntasks=1",
                f"--nodelist={info['node']}", self.profile.python, "-m", "hyperpod_lab.procs",
                "--job-id", rec.job_id, "--pid", str(info.get("pid")), "--signal", sig]
        if info.get("proc_start") is not None:
            argv += ["--start", str(int(info["proc_start"]))]
        try:
            self.remote.run(argv, timeout_s=30)
        except RemoteCommandError as e:
            raise JobStateError(f"could not {verb} rank {rank} (pid {info.get('pid')} on {info['node']}) of job "
                                f"{rec.job_id}: {e.stderr.strip()[-500:]}") from None
        return info

    def _fail_node(self, rec, rank):
        """``inject-fault --kind node``: set rank ``rank``'s node (``node`` of its
        ``ranks/rank-R.json``, as :meth:`_kill_rank` finds it) DOWN, so slurmctld kills every job
        step on it and the job loses the node as on a real node failure. The node must be one of
        the job's (or its joined allocations') nodes in squeue. Slurm leaves it DOWN: an operator
        (or ``ReturnToService``) brings it back with ``scontrol update NodeName=<node> State=RESUME``.

        Returns ``{"node", "how"}`` (``how``: the scontrol command run).

        Raises:
            JobStateError: the rank has not started, its node name is not a Slurm node name or
                not one of the job's nodes.
            NotAllowed: scontrol refused (needs Slurm administrator rights: SlurmUser, root or
                an AdminLevel of Operator); the message says an operator must do it.
            RemoteCommandError: squeue or scontrol failed otherwise.
        """
        from hyperpod_lab.errors import NotAllowed

        node = self.rank_info(rec, rank).get("node")
        if not isinstance(node, str) or not _SLURM_NODE_NAME.fullmatch(node):
            raise JobStateError(f"rank {rank} of job {rec.job_id} names node {str(node)[:100]!r}, which is not a "
                                "Slurm node name; refusing to fail it")
        ids = [self._id(rec)] + [str(j.get("native_id", "")) for j in self.joins(rec)
                                 if self.NATIVE_ID.fullmatch(str(j.get("native_id", "")))]
        # check=False: squeue exits 1 when one of the ids has left its memory; the others still print
        lists = self.remote.run(["squeue", "-h", "-o", "%N", "-j", ",".join(ids)], check=False,
                                timeout_s=30).stdout.split()
        ours = set(self.remote.run(["scontrol", "show", "hostnames", ",".join(lists)], timeout_s=30).stdout.split()
                   ) if lists else set()
        if node not in ours:
            raise JobStateError(f"node {node} of rank {rank} is not one of job {rec.job_id}'s nodes "
                                f"({', '.join(sorted(ours)) or 'none in squeue'}); refusing to fail it")
        # scontrol(1), "NODES - SPECIFICATIONS FOR UPDATE COMMAND": "State=DOWN: Stop all running
        # and suspended jobs and make the node unavailable for new jobs"; "Reason=<reason>: Identify
        # the reason the node is in a DOWN ... state" (one argv word here; the man page's quotes
        # are for the shell, and remote.quote_argv quotes each word)
        argv = ["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason=hyperpod-lab inject-fault {rec.job_id}"]
        res = self.remote.run(argv, check=False, timeout_s=30)
        if res.exit_status != 0:
            text = (res.stderr or res.stdout).strip()
            if scontrol_refused(text):
                raise NotAllowed(f"Slurm refused to set node {node} (rank {rank} of job {rec.job_id}) DOWN: "
                                 f"{text[-300:]}. Failing a node needs Slurm administrator rights; an operator "
                                 f"must run: scontrol update NodeName={node} State=DOWN "
                                 f"Reason=\"hyperpod-lab inject-fault {rec.job_id}\" (or use --kind kill or exception)")
            raise RemoteCommandError(argv, res.exit_status, text)
        return {"node": node, "how": f"scontrol update NodeName={node} State=DOWN "
                                     f"Reason=\"hyperpod-lab inject-fault {rec.job_id}\""}


_SLURM_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A single Slurm node name (no host list, no ``ALL``-style expression: letters, digits, ``._-``)."""


def scontrol_refused(text: str) -> bool:
    """Whether scontrol's error output says the user may not do it (``slurm_update error:
    Invalid user id``, ``Access/permission denied``), as opposed to any other failure."""
    return bool(re.search(r"invalid user id|access/permission denied|permission denied", text, re.IGNORECASE))
