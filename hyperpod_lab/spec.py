"""JobSpec: the one description of a training job, and its three policies.

A JobSpec is built once (from the CLI, a magic, the sidebar or Python), validated once, and
serialised to JSON. Each scheduler backend renders it into its own form (an sbatch script, a
torchrun command line, later a HyperPodPyTorchJob custom resource), and the in-job runtime
reads it back from ``$HYPERPOD_LAB_SPEC`` to learn its checkpoint and elastic policies.

This module imports nothing beyond the standard library, so the in-job runtime can use it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from hyperpod_lab.errors import SpecError
from hyperpod_lab.jobdir import RECOVERY_CHECKPOINTLESS, RECOVERY_MODES, RECOVERY_RESTART  # noqa: F401  (re-exported)


class SplitQuorumWarning(UserWarning):
    """A checkpointless spec whose elastic minimum lets two partial quorums commit the same step
    (:meth:`JobSpec.split_quorum_risk`): submitted anyway, with this warning."""


SPEC_VERSION = 1
LR_RULES = ("none", "linear", "sqrt")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


MAX_INT = 2**31 - 1  # Slurm and Kubernetes count nodes, minutes and retries in 32-bit integers


def _positive_int(name: str, value: Any, fix: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(name, f"must be a whole number >= 1, got {str(value)[:40]}; {fix}")
    if value > MAX_INT:
        raise SpecError(name, f"must be at most {MAX_INT}, got a number of {len(str(value))} digits; {fix}")


def _no_nul(name: str, values) -> None:
    """A NUL byte cannot be passed to a process (argv, environment, path): refuse it here."""
    for v in values:
        if isinstance(v, str) and "\0" in v:
            raise SpecError(name, "must not contain NUL bytes (\\0)")


MAX_SPARES = 64
MAX_STORM_RESTARTS = 1000
STRAGGLER_ACTIONS = ("report", "exclude")
TENSORBOARD_OFF = "off"
TENSORBOARD_RANK0 = "rank0"
TENSORBOARD_ALL_RANKS = "all-ranks"
TENSORBOARD_MODES = (TENSORBOARD_OFF, TENSORBOARD_RANK0, TENSORBOARD_ALL_RANKS)
"""``tensorboard``: none, rank 0 only (``<job>/tensorboard``), every rank (``<job>/tensorboard/rank-R``)."""
TRACKING_OFF = "off"
TRACKING_MLFLOW = "mlflow"
TRACKING_MODES = (TRACKING_OFF, TRACKING_MLFLOW)
"""``tracking``: no experiment tracker, or MLflow (:mod:`hyperpod_lab.runtime.mlflow_tracking`)."""
ENV_MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
"""MLflow's own variable: the submitting environment's tracking URI when ``tracking_uri`` is unset."""
MAX_TRACKING_URI_CHARS = 2000
MAX_HANG_TIMEOUT_S = 7 * 24 * 3600.0  # a week: anything longer is no hang detection


@dataclass
class ResiliencyPolicy:
    """What happens when a rank or node fails.

    Attributes:
        auto_resume: restart the job after a failure and resume from the newest complete
            checkpoint (torchrun restarts inside the allocation; on HyperPod nodes
            ``srun --auto-resume=1`` as well, elsewhere Slurm's ``--requeue``).
        max_retries: restarts allowed before the job is declared failed (torchrun
            ``--max-restarts``; HyperPod ``runPolicy.jobMaxRetryCount``).
        health_checks: run the runtime's pre-flight node health checks before training starts
            (Slurm: :mod:`hyperpod_lab.node.health` on every node of the allocation; a node
            that fails is excluded, replaced by a spare, or the job fails before step 0).
        spares: spare nodes (Slurm: the job asks for ``nodes + spares`` and trains on ``nodes``;
            a spare replaces a lost or excluded node with no requeue; EKS: the
            HyperPodPyTorchJob's ``spares``). 0 to 64.
        deep_health_check: EKS: run only on HyperPod nodes that passed a deep health check
            (node label ``sagemaker.amazonaws.com/deep-health-check-status: Passed``, present
            only where the cluster ran one).
        recovery: ``restart`` (a failure restarts every rank, which resume from the newest
            checkpoint tier) or ``checkpointless`` (each node is a data-parallel replica group
            under a torchft Lighthouse; survivors go on, a replacement heals from a live peer, the
            tiered checkpoint is only the fallback; see ``hyperpod_lab.runtime.checkpointless.ft``).
        hang_timeout_s: seconds without progress (no ``ctx.step``, no section entered or left)
            after which the launch agent's watchdog declares a rank hung, dumps its stacks,
            reports ``fault.detected`` {reason: "hang"} and kills it so it is recovered like a
            crash. ``None`` (default): derived from the job's own step times,
            ``max(30 s, 10 x p99 step time)`` after warm-up (see
            ``hyperpod_lab.node.watchdog``). On EKS with the HyperPod operator it also sets the
            log monitor's ``expectedRecurringFrequencyInSeconds``. From 1 s to a week.
        startup_timeout_s: the start-up budget, seconds: a rank (each start of it, restarts
            included) that made no progress from its first heartbeat (``hp.init()`` done) to its
            first step is hung, and so is one that stalls during its first steps for
            ``max(min(30 s, this), 10 x its slowest step so far)`` (until the hang timeout above
            applies). A rank that is running (not stopped) gets twice that: it may be waiting for
            a stopped peer. ``None`` (default): 600 s (``hyperpod_lab.node.watchdog``). From 1 s
            to a week.
        on_straggler: what a rank flagged as a straggler (its step compute time consistently
            above the other ranks', ``straggler.detected``) leads to: ``report`` (an event only)
            or ``exclude`` (Slurm: its node is excluded like a node that faulted twice; a spare
            replaces it, else the next placement avoids it).
        storm_restarts: K of the restart-storm guard (``hyperpod_lab.node.storm``): the job
            stops retrying (``job.failed``, exit status 3, no requeue) when K restarts in a row
            made no step progress, or ended with the same fault and no new checkpoint. 1 to 1000.
            In a checkpointless job it is also the no-progress K of in-process restarts.
        in_process_restarts: checkpointless jobs: in-process restarts (a step that raised is
            dropped in every replica group and redone in the same processes,
            ``hyperpod_lab.runtime.checkpointless.inprocess``) allowed within
            ``restart_window_s``; beyond, a fault restarts the rank's process (HyperPod's
            ``numRestartBeforeFullJobRestart``). 0 to 1000, default 5; 0 disables the rung.
        restart_window_s: seconds the in-process budget counts over (sliding; HyperPod's
            ``evalPeriodSeconds``). 1 s to a week, default 3600.
    """

    auto_resume: bool = True
    max_retries: int = 3
    health_checks: bool = True
    deep_health_check: bool = False
    recovery: str = "restart"
    spares: int = 0
    storm_restarts: int = 3
    hang_timeout_s: float | None = None
    on_straggler: str = "report"
    startup_timeout_s: float | None = None
    in_process_restarts: int = 5
    restart_window_s: float = 3600.0

    def validate(self) -> None:
        if not isinstance(self.auto_resume, bool):
            raise SpecError("resiliency.auto_resume", "must be true or false")
        if (isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0
                or self.max_retries > MAX_INT):
            raise SpecError("resiliency.max_retries",
                            f"must be a whole number from 0 to {MAX_INT}, got {str(self.max_retries)[:40]}; "
                            "use --max-retries 3")
        if self.recovery not in RECOVERY_MODES:
            raise SpecError("resiliency.recovery", f"must be one of {', '.join(RECOVERY_MODES)}, got {self.recovery!r}")
        if not isinstance(self.deep_health_check, bool):
            raise SpecError("resiliency.deep_health_check", "must be true or false")
        if not isinstance(self.health_checks, bool):
            raise SpecError("resiliency.health_checks", "must be true or false")
        if isinstance(self.spares, bool) or not isinstance(self.spares, int) or not 0 <= self.spares <= MAX_SPARES:
            raise SpecError("resiliency.spares", f"must be a whole number from 0 to {MAX_SPARES}, got "
                                                 f"{str(self.spares)[:40]}; use --spares 1")
        if (isinstance(self.storm_restarts, bool) or not isinstance(self.storm_restarts, int)
                or not 1 <= self.storm_restarts <= MAX_STORM_RESTARTS):
            raise SpecError("resiliency.storm_restarts", f"must be a whole number from 1 to {MAX_STORM_RESTARTS}, "
                                                         f"got {str(self.storm_restarts)[:40]}; use --storm-restarts 3")
        for field_name, flag, unset in (("hang_timeout_s", "--hang-timeout 120", "derive it from the job's step times"),
                                        ("startup_timeout_s", "--startup-timeout 300", "use the default, 600 s")):
            t = getattr(self, field_name)
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t != t
                                  or not 1.0 <= t <= MAX_HANG_TIMEOUT_S):
                raise SpecError(f"resiliency.{field_name}",
                                f"must be seconds from 1 to {MAX_HANG_TIMEOUT_S:.0f} (a week), or unset to {unset}; "
                                f"got {str(t)[:40]}; use {flag}")
        if (isinstance(self.in_process_restarts, bool) or not isinstance(self.in_process_restarts, int)
                or not 0 <= self.in_process_restarts <= MAX_STORM_RESTARTS):
            raise SpecError("resiliency.in_process_restarts",
                            f"must be a whole number from 0 to {MAX_STORM_RESTARTS}, got "
                            f"{str(self.in_process_restarts)[:40]}; use --in-process-restarts 5 (0: off)")
        w = self.restart_window_s
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w != w or not 1.0 <= w <= MAX_HANG_TIMEOUT_S:
            raise SpecError("resiliency.restart_window_s",
                            f"must be seconds from 1 to {MAX_HANG_TIMEOUT_S:.0f} (a week), got {str(w)[:40]}; "
                            "use --restart-window 3600")
        if self.on_straggler not in STRAGGLER_ACTIONS:
            raise SpecError("resiliency.on_straggler",
                            f"must be one of {', '.join(STRAGGLER_ACTIONS)}, got {str(self.on_straggler)[:40]!r}; "
                            "use --on-straggler report")


@dataclass
class CheckpointPolicy:
    """When and where the runtime checkpoints.

    Attributes:
        every_steps: persistent-tier interval in optimizer steps (DCP to shared storage).
        keep_last: complete persistent checkpoints to keep; older ones are deleted.
        memory_every_steps: CPU-memory tier interval in steps (tiered checkpointing);
            ``None`` disables the memory tier.
        s3_uri: ``s3://bucket/prefix`` of the S3 tier, or ``None``.
        s3_every_steps: S3-tier interval in steps; required when ``s3_uri`` is set.
    """

    every_steps: int = 20
    keep_last: int = 2
    memory_every_steps: int | None = None
    s3_uri: str | None = None
    s3_every_steps: int | None = None

    def validate(self) -> None:
        _positive_int("checkpoint.every_steps", self.every_steps, "use --checkpoint-every 20")
        _positive_int("checkpoint.keep_last", self.keep_last, "use --checkpoint-keep 2")
        _positive_int("checkpoint.memory_every_steps", self.memory_every_steps,
                      "use --checkpoint-memory-every 5, or leave it unset", allow_none=True)
        _positive_int("checkpoint.s3_every_steps", self.s3_every_steps,
                      "use --checkpoint-s3-every 100", allow_none=True)
        if self.s3_uri is not None:
            if not isinstance(self.s3_uri, str) or not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", self.s3_uri):
                raise SpecError("checkpoint.s3_uri", f"must look like s3://bucket/prefix, got {self.s3_uri!r}")
            if self.s3_every_steps is None:
                raise SpecError("checkpoint.s3_every_steps", "is required with checkpoint.s3_uri; use --checkpoint-s3-every 100")
            if self.s3_every_steps % self.every_steps:
                raise SpecError("checkpoint.s3_every_steps",
                                f"{self.s3_every_steps} must be a multiple of checkpoint.every_steps ({self.every_steps}): "
                                f"the S3 tier uploads persistent checkpoints")


@dataclass
class ElasticPolicy:
    """Elastic data parallelism: replicas (nodes) may join and leave.

    Attributes:
        min_nodes, max_nodes: bounds of the node count (torchrun ``--nnodes MIN:MAX``).
            Both ``None`` means a fixed-size job.
        global_batch_size: samples per optimizer step across all data-parallel replicas,
            kept through gradient accumulation as the world size changes; ``None`` lets the
            training script decide.
        lr_rule: how the learning rate follows the effective batch when the global batch
            size cannot be kept: ``none``, ``linear`` or ``sqrt``.
    """

    min_nodes: int | None = None
    max_nodes: int | None = None
    global_batch_size: int | None = None
    lr_rule: str = "linear"

    @property
    def enabled(self) -> bool:
        return self.min_nodes is not None

    def validate(self) -> None:
        if (self.min_nodes is None) != (self.max_nodes is None):
            raise SpecError("elastic", "give both bounds, e.g. --elastic 1:2")
        _positive_int("elastic.min_nodes", self.min_nodes, "use --elastic MIN:MAX with MIN >= 1", allow_none=True)
        _positive_int("elastic.max_nodes", self.max_nodes, "use --elastic MIN:MAX with MAX >= MIN", allow_none=True)
        if self.min_nodes is not None and self.min_nodes > self.max_nodes:
            raise SpecError("elastic", f"min_nodes {self.min_nodes} is greater than max_nodes {self.max_nodes}; "
                                       f"write --elastic {self.max_nodes}:{self.min_nodes}")
        _positive_int("elastic.global_batch_size", self.global_batch_size, "use --global-batch-size 64", allow_none=True)
        if self.lr_rule not in LR_RULES:
            raise SpecError("elastic.lr_rule", f"must be one of {', '.join(LR_RULES)}, got {self.lr_rule!r}")


def parse_elastic(text: str) -> tuple[int, int]:
    """Parse ``"MIN:MAX"`` (node counts). Raises SpecError naming ``elastic``."""
    m = re.fullmatch(r"\s*(-?\d+)\s*:\s*(-?\d+)\s*", text or "")
    if not m:
        raise SpecError("elastic", f"expected MIN:MAX node counts such as 1:2, got {text!r}")
    lo, hi = int(m.group(1)), int(m.group(2))
    ElasticPolicy(lo, hi).validate()
    return lo, hi


MAX_SPEC_BYTES = 256 * 1024  # a JobSpec as JSON; args and env are for flags, not data

# A container image for pyxis's ``srun --container-image`` (NVIDIA/pyxis README, "Usage":
# ``[USER@][REGISTRY#]IMAGE[:TAG]|PATH``; pyxis_slurmstepd.c takes a value starting with '.' or '/'
# as a squashfs path, anything else as a docker image it hands enroot as ``docker://<value>``).
# The registry form accepts both enroot's ``REGISTRY#IMAGE`` and the docker ``REGISTRY/IMAGE``
# spelling (the renderer writes the '#' form, which enroot 3.x needs). Image and tag follow
# enroot's reference grammar (src/docker.sh, docker::_parse_uri / docker::import: image
# ``[a-z0-9/._-]+``, tag ``[A-Za-z0-9._:-]+``), with no ':' in a tag.
_IMAGE_USER = r"[A-Za-z0-9_.-]+@"
_IMAGE_REGISTRY = r"[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?"
_IMAGE_NAME = r"[a-z0-9][a-z0-9._-]*(?:/[a-z0-9][a-z0-9._-]*)*"
_IMAGE_TAG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
CONTAINER_REGISTRY_IMAGE = re.compile(rf"(?:{_IMAGE_USER})?(?:{_IMAGE_REGISTRY}#)?{_IMAGE_NAME}(?::{_IMAGE_TAG})?")
"""A registry image as ``container_image`` accepts it (see :func:`validate_container_image`)."""
MAX_CONTAINER_IMAGE = 1024
_IMAGE_FIX = ("give a registry image such as nvcr.io/nvidia/pytorch:25.01-py3 (or nvcr.io#nvidia/pytorch:25.01-py3), "
              "or the absolute path of an enroot squashfs file on shared storage such as /fsx/images/pytorch.sqsh "
              "(made with: enroot import -o /fsx/images/pytorch.sqsh docker://nvcr.io#nvidia/pytorch:25.01-py3)")


def validate_container_image(name: str, value: Any) -> None:
    """Check a ``container_image`` value (JobSpec or cluster profile field ``name``).

    Accepted: ``None`` (no container), an absolute path of an enroot squashfs file (``/fsx/x.sqsh``;
    no whitespace or control characters), or a registry image ``[USER@][REGISTRY#]IMAGE[:TAG]``
    or ``[USER@]REGISTRY/IMAGE[:TAG]`` (:data:`CONTAINER_REGISTRY_IMAGE`). Refused: a relative
    path (pyxis would resolve it against the step's working directory), a ``docker://``-style
    scheme (pyxis adds it), a digest (``@sha256:``: enroot 3.x, which HyperPod's lifecycle
    scripts install, cannot parse it), whitespace, commas, quotes and control characters.

    Raises:
        SpecError: naming ``name`` and how to write the image.
    """
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise SpecError(name, f"must be a non-empty string or unset, got {str(value)[:40]!r}; {_IMAGE_FIX}")
    if len(value) > MAX_CONTAINER_IMAGE:
        raise SpecError(name, f"is {len(value)} characters long; at most {MAX_CONTAINER_IMAGE} are accepted")
    if re.search(r"[\s\x00-\x1f\x7f]", value):
        raise SpecError(name, f"{value[:80]!r} contains whitespace, a newline or a control character; {_IMAGE_FIX}")
    if value.startswith("/"):
        if "//" in value or value.endswith("/") or "/../" in value + "/" or "/./" in value + "/":
            raise SpecError(name, f"{value[:80]!r} is not a plain absolute path of a squashfs file; {_IMAGE_FIX}")
        return
    if value.startswith("."):
        raise SpecError(name, f"{value[:80]!r} is a relative path; give the absolute path of the squashfs file "
                              "(pyxis resolves a relative one against the training step's working directory)")
    if "://" in value:
        raise SpecError(name, f"{value[:80]!r} has a URI scheme; drop the '{value.split('://')[0]}://' (pyxis adds "
                              f"docker:// itself); {_IMAGE_FIX}")
    if "@sha256:" in value:
        raise SpecError(name, f"{value[:80]!r} pins a digest, which enroot 3.x cannot read; pin a tag, or import "
                              f"the image once to a .sqsh file and give its path; {_IMAGE_FIX}")
    if not CONTAINER_REGISTRY_IMAGE.fullmatch(enroot_image(value)):
        raise SpecError(name, f"{value[:80]!r} is not a container image reference; {_IMAGE_FIX}")


def enroot_image(value: str) -> str:
    """``value`` as pyxis's ``--container-image`` takes it on every enroot release: a docker-style
    ``[USER@]REGISTRY/IMAGE[:TAG]`` (the first component names a registry when it holds a '.' or a
    ':', the rule of enroot 4's docker::_parse_uri) becomes ``[USER@]REGISTRY#IMAGE[:TAG]``, the
    only form enroot 3.x reads (it takes ``nvcr.io/nvidia/pytorch`` for a Docker Hub image of
    that name); Docker Hub names (``ubuntu:24.04``, ``nvidia/cuda:12.8.0-base-ubuntu24.04``), the
    '#' form and squashfs paths are returned as they are. Pure; no validation."""
    if value.startswith((".", "/")) or "#" in value:
        return value
    head, sep, rest = value.partition("/")
    user, at, reg = head.rpartition("@")
    if sep and ("." in reg or ":" in reg):
        return f"{user}{at}{reg}#{rest}"
    return value


# Variables that make a process run code of the setter's choosing before (or instead of) the
# script: the dynamic loader (LD_PRELOAD ...), Python's start-up (PYTHONSTARTUP, PYTHONPATH,
# PYTHONHOME ...), shells (BASH_ENV, ENV, PATH), other interpreters a script may start, and
# programs that open URLs (BROWSER). On the local backend the job runs on the Jupyter host, so
# who may set them may run code there: the server accepts them only from a user who may also
# run kernels (see docs/architecture.md, "Trust").
_HOST_CODE_ENV = re.compile(r"LD_[A-Z_]*|PYTHON[A-Z_]*|BROWSER|BASH_ENV|ENV|PATH|IFS|PROMPT_COMMAND|SHELLOPTS|"
                            r"PERL5?LIB|PERL5OPT|RUBYLIB|RUBYOPT|NODE_OPTIONS|NODE_PATH|JAVA_TOOL_OPTIONS|"
                            r"_JAVA_OPTIONS|GCONV_PATH|GIT_[A-Z_]*|SSH_ASKPASS|EDITOR|VISUAL|PAGER")


def host_code_env(names) -> list[str]:
    """The names among ``names`` that let whoever sets them run code in the job's processes
    besides the script (``LD_PRELOAD``, ``PYTHON*``, ``BROWSER``, ``PATH``, ...), sorted."""
    return sorted(n for n in names if isinstance(n, str) and _HOST_CODE_ENV.fullmatch(n))


def secret_values(names: list[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The values of the secret variables ``names`` in ``environ`` (default: this process's).

    Raises:
        SpecError: a name is not set there (field ``secret_env``).
    """
    environ = os.environ if environ is None else environ
    missing = [n for n in names if n not in environ]
    if missing:
        raise SpecError("secret_env", f"{', '.join(missing)} is not set in the environment of the submitting "
                                      "process (the notebook kernel or the Jupyter server); set it there first, "
                                      "e.g. %env NAME=... in the notebook")
    return {n: environ[n] for n in names}


@dataclass
class JobSpec:
    """A training job, independent of where it runs.

    Attributes:
        script: path of the training script on the submitting machine.
        name: job name; any printable text (it is passed to the scheduler as data).
        cluster: cluster profile name (see ``hyperpod_lab.submit.clusters``).
        nodes: nodes to allocate (the initial size of an elastic job).
        procs_per_node: training processes (ranks) per node.
        args: arguments passed to the script, verbatim.
        env: extra environment variables for the ranks (written to the job's files: no secrets).
        secret_env: names of variables whose values are taken from the submitting process's
            environment at submit time and reach the ranks without being written to ``spec.json``,
            the batch script, the job store or logs (Slurm: sbatch's own environment; EKS: a
            Kubernetes Secret; local: the launcher's environment).
        partition: Slurm partition, or ``None`` for the profile's default.
        time_limit_min: wall-clock limit in minutes, or ``None``.
        exclusive: Slurm: the nodes are the job's alone (``sbatch --exclusive``); ``None``
            chooses for you: on when the cluster profile has GPUs (``gpus_per_node``), as AWS's
            reference scripts do, off otherwise.
        resiliency, checkpoint, elastic: the three policies.
        tensorboard: TensorBoard event files of the step metrics in ``<job_dir>/tensorboard``
            (torch's SummaryWriter, :mod:`hyperpod_lab.runtime.tensorboard`): ``"off"``
            (default), ``"rank0"`` (the rank that reports the job's steps) or ``"all-ranks"``
            (``rank-<R>`` subdirectories); ``true``/``false`` are read as ``"rank0"``/``"off"``.
            Needs the ``tensorboard`` package where the spec is validated and where the job runs.
        tracking: ``"off"`` (default) or ``"mlflow"``: rank 0 logs the job to one MLflow run
            (the spec as params, the step metrics, checkpoint/fault/recovery markers, goodput and
            the final state; :mod:`hyperpod_lab.runtime.mlflow_tracking`, docs/tracking.md).
            Needs the ``mlflow`` (or ``mlflow-skinny``) package where the spec is validated and
            where the job runs.
        tracking_uri: the MLflow tracking URI (``http://host:5000``, ``databricks``...), at most
            2,000 characters, no password in it (use ``--secret-env MLFLOW_TRACKING_PASSWORD``).
            Unset with ``tracking="mlflow"``: :meth:`validate` takes ``$MLFLOW_TRACKING_URI`` of
            the validating (submitting) process and records it here, so the job's ``spec.json``
            names the server the job logs to; neither set is a :class:`SpecError`.
        container_image: Slurm: run the training step in this container through pyxis/enroot
            (``srun --container-image``), with the shared root and ``/dev/shm`` mounted (see
            ``docs/containers.md``): a registry image (``nvcr.io/nvidia/pytorch:25.01-py3``) or the
            absolute path of an enroot ``.sqsh`` file on shared storage. ``None`` takes the cluster
            profile's ``container_image`` (none if unset). Checked by :func:`validate_container_image`.
    """

    script: str
    name: str = "train"
    cluster: str = "local"
    nodes: int = 1
    procs_per_node: int = 1
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: list[str] = field(default_factory=list)
    partition: str | None = None
    time_limit_min: int | None = None
    exclusive: bool | None = None
    resiliency: ResiliencyPolicy = field(default_factory=ResiliencyPolicy)
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    elastic: ElasticPolicy = field(default_factory=ElasticPolicy)
    tensorboard: str = TENSORBOARD_OFF
    tracking: str = TRACKING_OFF
    tracking_uri: str | None = None
    container_image: str | None = None
    version: int = SPEC_VERSION

    @property
    def world_size(self) -> int:
        """Ranks at the initial size: nodes x procs_per_node."""
        return self.nodes * self.procs_per_node

    def split_quorum_risk(self) -> str | None:
        """Why this checkpointless job could end with replicas that differ, or None: with 3 or
        more replica groups (one a node) and an elastic minimum (the Lighthouse's and every
        Manager's ``min_replicas``; 1 when unset) at most half of them, survivors that notice a
        loss at different times can form two disjoint partial quorums that commit the same step
        from different gradients, and torchft then heals neither (only groups behind the
        highest step heal; seen in tests/runtime/test_scale16_slurm.py, docs/scale.md). A 2-group
        job is left alone: its survivor must be able to go on alone."""
        if self.resiliency.recovery != RECOVERY_CHECKPOINTLESS or self.nodes < 3:
            return None
        majority = self.nodes // 2 + 1
        floor = self.elastic.min_nodes if self.elastic.enabled else 1
        if floor >= majority:
            return None
        upper = self.elastic.max_nodes if self.elastic.enabled else self.nodes
        return (f"checkpointless job of {self.nodes} replica groups with an elastic minimum of {floor}: two "
                f"disjoint partial quorums could commit the same step after a loss and leave the replicas' "
                f"parameters different; use --elastic {majority}:{max(upper, self.nodes)} (a majority) unless "
                f"the job must go on with fewer than half its groups (docs/checkpointless.md)")

    def validate(self) -> "JobSpec":
        """Check every field; return self. Raises SpecError naming the field and the fix."""
        if self.version != SPEC_VERSION:
            raise SpecError("version", f"this hyperpod-lab reads JobSpec version {SPEC_VERSION}, got {self.version!r}; upgrade hyperpod-lab")
        if not isinstance(self.script, str) or not self.script.strip():
            raise SpecError("script", "give the path of the training script, e.g. examples/train_lm.py")
        _no_nul("script", [self.script])
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError("name", "must not be empty; use --name my-run")
        if len(self.name) > 128 or _CONTROL_CHARS.search(self.name):
            raise SpecError("name", "must be at most 128 printable characters with no newlines or control characters")
        if not isinstance(self.cluster, str) or not self.cluster:
            raise SpecError("cluster", "give a cluster profile name, e.g. --cluster local-slurm")
        _positive_int("nodes", self.nodes, "use --nodes 1 or more")
        _positive_int("procs_per_node", self.procs_per_node, "use --procs-per-node 1 or more")
        _positive_int("time_limit_min", self.time_limit_min, "give minutes, e.g. 60", allow_none=True)
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise SpecError("args", "must be a list of strings")
        _no_nul("args", self.args)
        if not isinstance(self.env, dict) or not all(
                isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
                for k, v in self.env.items()):
            raise SpecError("env", "keys must be variable names ([A-Za-z_][A-Za-z0-9_]*) and values strings")
        _no_nul("env", self.env.values())
        if not isinstance(self.secret_env, list) or not all(
                isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in self.secret_env):
            raise SpecError("secret_env", "must be a list of variable names ([A-Za-z_][A-Za-z0-9_]*), e.g. "
                                          "--secret-env HF_TOKEN")
        both = sorted(set(self.secret_env) & set(self.env))
        if both:
            raise SpecError("secret_env", f"{', '.join(both)} is also in env; pass a secret with --secret-env only")
        size = len(self.to_json())
        if size > MAX_SPEC_BYTES:
            raise SpecError("spec", f"is {size} bytes as JSON; at most {MAX_SPEC_BYTES} are accepted (pass large "
                                    "inputs as files, not as args or env)")
        if not (self.exclusive is None or isinstance(self.exclusive, bool)):
            raise SpecError("exclusive", f"must be true, false or unset, got {self.exclusive!r}")
        if self.partition is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(self.partition)):
            raise SpecError("partition", f"{self.partition!r} is not a Slurm partition name")
        validate_container_image("container_image", self.container_image)
        self.resiliency.validate()
        self.checkpoint.validate()
        self._validate_tensorboard()
        self._validate_tracking()
        self.elastic.validate()
        if self.elastic.enabled and not (self.elastic.min_nodes <= self.nodes <= self.elastic.max_nodes):
            raise SpecError("nodes", f"{self.nodes} is outside --elastic {self.elastic.min_nodes}:{self.elastic.max_nodes}")
        gbs = self.elastic.global_batch_size
        if gbs is not None and gbs % self.world_size:
            raise SpecError("elastic.global_batch_size",
                            f"{gbs} is not divisible by the world size {self.world_size}; pick a multiple of {self.world_size}")
        return self

    def _validate_tensorboard(self) -> None:
        tb = self.tensorboard
        if isinstance(tb, bool):
            tb = self.tensorboard = TENSORBOARD_RANK0 if tb else TENSORBOARD_OFF
        if tb not in TENSORBOARD_MODES:
            raise SpecError("tensorboard", f"must be one of {', '.join(TENSORBOARD_MODES)} (or true/false), got "
                                           f"{str(tb)[:40]!r}; use --tensorboard or --tensorboard all-ranks")
        if tb != TENSORBOARD_OFF and importlib.util.find_spec("tensorboard") is None:
            raise SpecError("tensorboard", "needs the tensorboard package (torch's SummaryWriter writes through "
                                           "it), which is not installed in this Python environment; "
                                           "pip install tensorboard, or submit without --tensorboard")

    def _validate_tracking(self) -> None:
        """``tracking`` and ``tracking_uri`` (resolved from ``$MLFLOW_TRACKING_URI`` when unset)."""
        if self.tracking not in TRACKING_MODES:
            raise SpecError("tracking", f"must be one of {', '.join(TRACKING_MODES)}, got {str(self.tracking)[:40]!r}; "
                                        "use --tracking mlflow")
        uri = self.tracking_uri
        if uri is not None:
            if not isinstance(uri, str) or not uri.strip():
                raise SpecError("tracking_uri", "must be a non-empty string such as http://mlflow.example:5000, "
                                                "or unset")
            if len(uri) > MAX_TRACKING_URI_CHARS or _CONTROL_CHARS.search(uri):
                raise SpecError("tracking_uri", f"must be at most {MAX_TRACKING_URI_CHARS} printable characters "
                                                "with no newlines or control characters")
            userinfo = uri.partition("://")[2].split("/", 1)[0].rpartition("@")[0]
            if ":" in userinfo:  # user:password@host: the spec is written to the job's files
                raise SpecError("tracking_uri", "contains a password (user:password@host), and the spec is "
                                                "written to the job's files; give the URI without it and pass "
                                                "the password with --secret-env MLFLOW_TRACKING_PASSWORD "
                                                "(and MLFLOW_TRACKING_USERNAME)")
        if self.tracking == TRACKING_OFF:
            return
        if uri is None:
            env_uri = os.environ.get(ENV_MLFLOW_TRACKING_URI, "").strip()
            if not env_uri:
                raise SpecError("tracking_uri", "tracking mlflow needs the tracking server's URI: give it with "
                                                "--tracking-uri URI (JobSpec tracking_uri), or set "
                                                f"{ENV_MLFLOW_TRACKING_URI} in the submitting environment")
            self.tracking_uri = env_uri
            self._validate_tracking()  # the same checks on the URI taken from the environment
            return
        if importlib.util.find_spec("mlflow") is None:
            raise SpecError("tracking", "needs the mlflow package (its client logs the run), which is not "
                                        "installed in this Python environment; pip install mlflow-skinny "
                                        "(or mlflow), or submit without --tracking mlflow")

    # ---- JSON round trip -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobSpec":
        """Build and validate. Unknown keys raise SpecError naming them."""
        if not isinstance(data, dict):
            raise SpecError("spec", "must be a JSON object")
        data = dict(data)
        policies = {"resiliency": ResiliencyPolicy, "checkpoint": CheckpointPolicy, "elastic": ElasticPolicy}
        for key, pcls in policies.items():
            sub = data.get(key, {}) or {}
            if not isinstance(sub, dict):
                raise SpecError(key, "must be an object")
            _reject_unknown(pcls, sub, prefix=key + ".")
            data[key] = pcls(**sub)
        _reject_unknown(cls, data)
        if "script" not in data:
            raise SpecError("script", "is required")
        return cls(**data).validate()

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError("spec", f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        return cls.from_dict(data)


def _reject_unknown(cls: type, data: dict[str, Any], prefix: str = "") -> None:
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise SpecError(prefix + str(key), f"unknown field; known fields are {', '.join(sorted(known))}")
