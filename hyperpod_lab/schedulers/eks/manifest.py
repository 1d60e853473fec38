"""Kubernetes manifests of a JobSpec (pure renderers, golden-file tested).

Two custom resources run the same JobSpec on an EKS cluster:

* ``HyperPodPyTorchJob`` (``sagemaker.amazonaws.com/v1``) for clusters with the SageMaker
  HyperPod training operator. The pods run ``hyperpodrun`` (the HyperPod elastic agent, a
  torchrun superset; it listens on container port 8080 for the operator).
* ``PyTorchJob`` (``kubeflow.org/v1``) for EKS clusters without it. The pods run our
  launcher (``python -m hyperpod_lab.node.launch``, torchrun plus fault/recovery events);
  the Kubeflow operator passes the rendezvous settings as ``PET_*`` environment variables,
  which torchrun's parser reads.

Checkpointless jobs (``resiliency.recovery: checkpointless``), with either operator: the job's
torchft Lighthouse runs in its own pod (``python -m hyperpod_lab.node.lighthouse``) behind a
Service (:func:`render_lighthouse_service`), and every other pod is one data-parallel replica
group running our launch agent ``--standalone`` (hang watchdog, stragglers, storm guard,
in-process restarts), its group number taken from its pod name. The Lighthouse's pod plays the
Slurm supervisor's part that EKS still needs (the Lighthouse, the end of the job); the operator
plays the rest (it restarts or recreates the one faulty pod, which heals from the live groups,
and scales the groups within ``elasticPolicy``; the runtime keeps the global batch).

Where the script goes, and why a ConfigMap: the training script and ``spec.json`` travel in a
ConfigMap (rendered by :func:`render_job_configmap`) mounted read-only at :data:`JOB_MOUNT`.
Creating it needs only the Kubernetes API the job itself needs; writing to the FSx volume
instead would need the notebook host to mount that file system (or a helper pod), which
notebooks usually do not. The cost: a ConfigMap holds at most 1 MiB, so larger scripts are
refused with an error (put them on the shared file system and keep a small entry script).

Field names follow the ``sagemaker-hyperpod`` SDK's pydantic model of the resource
(``sagemaker.hyperpod.training.config.hyperpod_pytorch_job_unified_config``); the tests
validate every rendered resource against it.
"""

from __future__ import annotations

import base64
import copy
import posixpath
import re
import shlex
from typing import Any

from hyperpod_lab import jobdir
from hyperpod_lab._version import __version__
from hyperpod_lab.errors import ConfigError, SpecError
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.spec import RECOVERY_CHECKPOINTLESS, RECOVERY_RESTART, JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile

HYPERPOD_GROUP, HYPERPOD_VERSION, HYPERPOD_KIND, HYPERPOD_PLURAL = (
    "sagemaker.amazonaws.com", "v1", "HyperPodPyTorchJob", "hyperpodpytorchjobs")
KUBEFLOW_GROUP, KUBEFLOW_VERSION, KUBEFLOW_KIND, KUBEFLOW_PLURAL = (
    "kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")

JOB_MOUNT = "/opt/hyperpod-lab/job"  # the ConfigMap (script + spec.json), read-only
DEFAULT_SHARED_MOUNT = "/fsx"
DEFAULT_NAMESPACE = "default"
# HyperPod's node labels (docs "Health Monitoring System" / "Resiliency-related Kubernetes labels
# by SageMaker HyperPod"): node-health-status is the one meant for scheduling (AWS's
# HyperPodPyTorchJob examples require it to be Schedulable, e.g. awsome-distributed-training
# 3.test_cases/pytorch/FSDP/kubernetes/llama3_1_8b-fsdp-hpto.yaml); deep-health-check-status
# exists only on nodes that ran deep health checks, so it is required only when asked.
NODE_HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
NODE_SCHEDULABLE = "Schedulable"
DEEP_HEALTH_CHECK_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# what AWS's EKS examples set with EFA devices (FSDP/kubernetes/llama3_1_8b-fsdp-hpto.yaml)
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
# the job's final status stays readable this long after it ends, then the operator deletes it
TTL_AFTER_FINISHED_S = 3600
# Kubeflow names pods and services <job>-<replica type>-<index> (DNS-1123 labels, <= 63 chars);
# the job name itself must be a DNS-1035 label (the training operator's webhook). Names are cut
# to leave room for "-workers-" / "-master-" and an index of up to MAX_INDEX_DIGITS digits.
K8S_LABEL_MAX = 63
MAX_INDEX_DIGITS = 5
NAME_MAX = K8S_LABEL_MAX - len("-workers-") - MAX_INDEX_DIGITS
JOB_ID_LABEL = "hyperpod-lab.io/job-id"
AGENT_PORT = 8080  # the HyperPod elastic agent's port
CONFIGMAP_MAX_BYTES = 1024 * 1024
SPEC_KEY = "spec.json"

# Checkpointless jobs (see render_checkpointless_replicas): one pod per data-parallel replica group
# plus the Lighthouse's pod, told apart by ROLE_LABEL; the groups reach the Lighthouse through its
# Service, <name>-lighthouse.<namespace>.svc:LIGHTHOUSE_PORT (Kubernetes docs, "DNS for Services
# and Pods": a Service gets the record <service>.<namespace>.svc.<cluster domain>, and a pod's
# resolver searches <namespace>.svc.<cluster domain> first).
ROLE_LABEL = "hyperpod-lab.io/role"
ROLE_LIGHTHOUSE, ROLE_GROUP = "lighthouse", "replica-group"
LIGHTHOUSE_PORT = 29510
LIGHTHOUSE_REPLICA = "lighthouse"  # the HyperPodPyTorchJob replica spec of the Lighthouse pod
TORCHFT_LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own variable (hyperpod_lab.runtime.checkpointless.ft)
POD_NAME_ENV, POD_IP_ENV = "POD_NAME", "POD_IP"  # downward API (fieldRef metadata.name / status.podIP)

# Hang detection. The pattern matches the step line local rank 0 of every pod prints through the
# runtime's ``JobContext.step`` (``hyperpod-lab: rank 0 step 3 loss 2.1234``, at most once per
# ``$HYPERPOD_LAB_STEP_EVENT_INTERVAL_S``) and the example's own ``step 3 loss 2.1234 tok/s 5120``.
# The job counts as hung when no step line arrives for hang_after_s(spec) seconds (the runtime's
# hang timeout plus the line's interval, else HANG_AFTER_S), and as failed to start when none
# arrives within START_CUTOFF_S.
STEP_LOG_PATTERN = r".*\bstep (\d+) loss .*"
START_CUTOFF_S = 900
HANG_AFTER_S = 600
"""The hang rule's period when the spec sets no ``resiliency.hang_timeout_s``: the derived T of
the launch agent's watchdog (``max(30 s, 10 x p99 step time)``, measured while the job runs) cannot
be rendered into the resource, so the operator waits this long."""


def hang_after_s(spec: JobSpec) -> int:
    """``expectedRecurringFrequencyInSeconds`` of the ``JobHangingDetection`` rule, consistent with
    the runtime's hang timeout T: the step line is printed at most once per
    ``HYPERPOD_LAB_STEP_EVENT_INTERVAL_S`` (the spec's ``env``, default 1 s), so with
    ``resiliency.hang_timeout_s`` = T a live job prints one at least every T + that interval
    (``ceil``, s); without T, :data:`HANG_AFTER_S`."""
    t = spec.resiliency.hang_timeout_s
    if t is None:
        return HANG_AFTER_S
    try:
        interval = float(spec.env.get(jobdir.ENV_STEP_INTERVAL, "1") or 1)
    except ValueError:
        interval = 1.0
    return int(-(-(float(t) + max(0.0, interval)) // 1))
RESTART_EVAL_PERIOD_S = 3600
GRACEFUL_SHUTDOWN_S = 120


def resource_name(job_id: str) -> str:
    """The Kubernetes name of a job's resources: ``job_id`` as a DNS-1035 label (lower-case
    letters, digits and '-', starting with a letter: the Kubeflow training operator's webhook
    rejects a PyTorchJob named otherwise) of at most :data:`NAME_MAX` characters, so that
    ``<name>-workers-<index>`` stays within 63. An id starting with a digit gets a ``j-`` in
    front. A longer id loses characters of its name part, never of its random tail, so two jobs
    never share a name."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    if name and not name[0].isalpha():
        name = "j-" + name
    if len(name) > NAME_MAX:  # shorten the name part, keep the id's random tail (distinct jobs, distinct names)
        head, _, tail = name.rpartition("-")
        tail = tail[-16:]
        name = (head[:NAME_MAX - 1 - len(tail)].rstrip("-") + "-" + tail).lstrip("-")
        if not name[0].isalpha():
            name = "j" + name[1:] if name[0] == "-" else "j-" + name[2:]
    return name or "job"


def check_pod_names(job_id: str, max_replicas: int) -> None:
    """Raise SpecError when a pod of the job, ``<name>-workers-<index>`` for the largest index
    it can reach (``max_replicas - 1``), would not fit a 63-character DNS label."""
    longest = f"{resource_name(job_id)}-workers-{max_replicas - 1}"
    if len(longest) > K8S_LABEL_MAX:
        raise SpecError("elastic.max_nodes", f"pod name {longest!r} would exceed {K8S_LABEL_MAX} characters; "
                                             f"use at most {10 ** MAX_INDEX_DIGITS} nodes")


def configmap_name(job_id: str) -> str:
    return resource_name(job_id) + "-job"


def secret_name(job_id: str) -> str:
    """The Kubernetes Secret holding a job's ``secret_env`` values."""
    return resource_name(job_id) + "-secrets"


def pod_job_dir(job_id: str, shared_mount: str = DEFAULT_SHARED_MOUNT) -> str:
    """The job directory inside the pods (on the FSx volume), where the runtime writes events."""
    return JobPaths.for_job(shared_mount, job_id).folder


def k8s_literal(text: str) -> str:
    """``text`` escaped so the kubelet passes it verbatim: it expands ``$(VAR)`` in a container's
    command, args and env values and reduces ``$$`` to ``$``, so every ``$`` is doubled."""
    return text.replace("$", "$$")


def _require(profile: ClusterProfile, key: str, example: str) -> str:
    value = getattr(profile, key)
    if not value:
        raise ConfigError(f"cluster profile '{profile.name}': set '{key}' to render EKS jobs, e.g. {key} = {example}")
    return value


def job_env(spec: JobSpec, job_id: str, shared_mount: str, extra: dict[str, str] | None = None,
            fields: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The container environment: the same ``HYPERPOD_LAB_*`` variables ``render_sbatch``
    exports (job id, job dir, spec path, shared root), ``extra`` (the renderer's own, e.g. a
    checkpointless group's), then the spec's own ``env``; ``fields``: variables from the
    downward API (``{name: fieldPath}``, Kubernetes docs "Expose Pod Information to Containers
    Through Environment Variables"); secrets by ``secretKeyRef``."""
    env = {
        **jobdir.job_env(job_id, pod_job_dir(job_id, shared_mount), posixpath.join(JOB_MOUNT, SPEC_KEY), shared_mount),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **(extra or {}),
    }
    env.update(spec.env)
    out: list[dict[str, Any]] = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": path}}}
                                 for k, path in (fields or {}).items()]
    out += [{"name": k, "value": k8s_literal(v)} for k, v in env.items()]
    # secrets by reference: the values live in the job's Secret, never in the pod spec
    out += [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name(job_id), "key": k}}}
            for k in spec.secret_env]
    return out


def _script_path(spec: JobSpec) -> str:
    return posixpath.join(JOB_MOUNT, posixpath.basename(spec.script))


def _pod_template(spec: JobSpec, job_id: str, profile: ClusterProfile, command: list[str],
                  container: str, port: int | None, deep_health_check: bool,
                  hyperpod: bool = True, env: dict[str, str] | None = None, fields: dict[str, str] | None = None,
                  role: str | None = None) -> dict[str, Any]:
    """A pod template running ``command``; ``role`` (checkpointless) labels it
    (:data:`ROLE_LABEL`); the Lighthouse's pod gets no GPU or EFA devices and no ``/dev/shm``."""
    image = _require(profile, "image", '"123456789012.dkr.ecr.us-west-2.amazonaws.com/train:latest"')
    pvc = _require(profile, "pvc", '"fsx-claim"')
    mount = profile.shared_mount or DEFAULT_SHARED_MOUNT
    lighthouse = role == ROLE_LIGHTHOUSE
    c: dict[str, Any] = {
        "name": container,
        "image": image,
        "command": command,
        "env": job_env(spec, job_id, mount, env, fields),
        "volumeMounts": [{"name": "fsx", "mountPath": mount},
                         {"name": "job", "mountPath": JOB_MOUNT, "readOnly": True}],
    }
    if port is not None:
        c["ports"] = [{"containerPort": port}]
    devices: dict[str, int] = {}
    if profile.gpus_per_node and not lighthouse:
        devices["nvidia.com/gpu"] = int(profile.gpus_per_node)
    if profile.efa and not lighthouse:  # EFA devices and the libfabric settings AWS's examples pass with them
        devices[EFA_RESOURCE] = int(profile.efa_per_node)
        c["env"] = [{"name": k, "value": v} for k, v in EFA_ENV.items() if k not in spec.env] + c["env"]
    if devices:
        c["resources"] = {"limits": dict(devices), "requests": dict(devices)}
    pod: dict[str, Any] = {
        "containers": [c],
        "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": pvc}},
                    {"name": "job", "configMap": {"name": configmap_name(job_id)}}],
    }
    if not lighthouse:
        # /dev/shm memory-backed (as AWS's examples mount it): the memory checkpoint tier lives there,
        # NCCL and DataLoader workers use it; a container's own /dev/shm is 64 MiB
        c["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
        shm: dict[str, Any] = {"medium": "Memory"}
        if profile.shm_size:
            shm["sizeLimit"] = profile.shm_size
        pod["volumes"].append({"name": "dshm", "emptyDir": shm})
    selector = {NODE_HEALTH_LABEL: NODE_SCHEDULABLE} if hyperpod else {}
    if deep_health_check:
        selector[DEEP_HEALTH_CHECK_LABEL] = "Passed"
    if selector:
        pod["nodeSelector"] = selector
    labels = {JOB_ID_LABEL: resource_name(job_id)}
    if role:
        labels[ROLE_LABEL] = role
    return {"metadata": {"labels": labels}, "spec": pod}


def _check_supported(spec: JobSpec) -> None:
    recovery = getattr(spec.resiliency, "recovery", RECOVERY_RESTART)
    if recovery not in (RECOVERY_RESTART, RECOVERY_CHECKPOINTLESS):
        raise SpecError("resiliency.recovery", f"{recovery!r} recovery is not available on EKS "
                                               f"(only 'restart' and 'checkpointless')")
    if recovery == RECOVERY_CHECKPOINTLESS and spec.resiliency.spares:
        raise SpecError("resiliency.spares", "hot spares of a checkpointless job run on Slurm only: on EKS the "
                                             "operator replaces a lost replica group's pod, which heals from the live "
                                             "groups; submit with --spares 0, or to a Slurm cluster")


def is_checkpointless(spec: JobSpec) -> bool:
    return spec.resiliency.recovery == RECOVERY_CHECKPOINTLESS


def is_kubeflow(profile: ClusterProfile) -> bool:
    """The profile's operator is Kubeflow's training operator (a ``PyTorchJob``), not HyperPod's."""
    return (profile.operator or "hyperpod") == "kubeflow"


def lighthouse_service_name(job_id: str) -> str:
    """The Service in front of a checkpointless job's Lighthouse pod (a DNS-1035 label of at most
    60 characters: :data:`NAME_MAX` + ``-lighthouse``)."""
    return resource_name(job_id) + "-lighthouse"


def lighthouse_url(job_id: str, profile: ClusterProfile) -> str:
    """The groups' ``$TORCHFT_LIGHTHOUSE``: HyperPod, ``http://<name>-lighthouse.<namespace>.svc:<port>``
    (our Service, :func:`render_lighthouse_service`); Kubeflow, ``http://<name>-master-0:<port>``:
    the training operator gives every pod a Service of the pod's own name and points the workers'
    ``MASTER_ADDR`` at the Master's (kubeflow/training-operator pkg/controller.v1/pytorch/envvar.go,
    ``setPodEnv``; the pod's resolver searches its namespace), and the Master is the Lighthouse."""
    if is_kubeflow(profile):
        return f"http://{resource_name(job_id)}-master-0:{LIGHTHOUSE_PORT}"
    ns = profile.namespace or DEFAULT_NAMESPACE
    return f"http://{lighthouse_service_name(job_id)}.{ns}.svc:{LIGHTHOUSE_PORT}"




def extra_resources(spec: JobSpec, job_id: str, profile: ClusterProfile) -> list[dict[str, Any]]:
    """What a job needs besides its ConfigMap, Secret and custom resource: a checkpointless
    HyperPodPyTorchJob's Lighthouse Service (a Kubeflow job's Master has the operator's)."""
    if is_checkpointless(spec) and not is_kubeflow(profile):
        return [render_lighthouse_service(spec, job_id, profile)]
    return []


def group_command(spec: JobSpec, job_id: str, mount: str) -> list[str]:
    """A checkpointless replica group's container command (pure): ``/bin/sh -c`` takes the
    group's number from the pod's name (``$POD_NAME``, the downward API's ``metadata.name``; the
    operators name pods ``<job>-<replica type>-<index>``: the index is the group, and a pod the
    operator recreates keeps its name, so its group) into ``$HYPERPOD_LAB_REPLICA_GROUP``, then
    ``exec``s the launch agent as the Slurm step does (``--standalone``: each group is its own
    torchrun; hang watchdog, stragglers, storm guard, in-process restarts). The script's
    arguments reach it as ``"$@"``, never as shell text; every ``$`` is doubled for the kubelet."""
    paths = JobPaths(pod_job_dir(job_id, mount))
    group = f"${jobdir.ENV_REPLICA_GROUP}"
    launch = jobdir.launcher_argv("python", _script_path(spec), [], nproc_per_node=spec.procs_per_node,
                                  max_restarts=jobdir.effective_restarts(spec.resiliency),
                                  log_dir=shlex.quote(paths.path("logs", "torchrun")) + f'/group-"{group}"',
                                  standalone=True, monitor_interval=0.1, quote=shlex.quote)
    script = "; ".join([
        f'export {jobdir.ENV_REPLICA_GROUP}="${{{POD_NAME_ENV}##*-}}"',
        f'case "{group}" in ""|*[!0-9]*) echo "hyperpod-lab: pod name ${POD_NAME_ENV} ends in no replica '
        f'group number" >&2; exit 2;; esac',
        f'echo "hyperpod-lab: pod ${POD_NAME_ENV} runs replica group {group}"',
        "exec " + " ".join(launch) + ' "$@"',
    ])
    return ["/bin/sh", "-c", k8s_literal(script), "hyperpod-lab-group", *map(k8s_literal, spec.args)]


def lighthouse_command(spec: JobSpec, job_id: str, mount: str) -> list[str]:
    """The Lighthouse pod's command (pure): :mod:`hyperpod_lab.node.lighthouse` on
    :data:`LIGHTHOUSE_PORT` of the pod's own address (``$HYPERPOD_LAB_LIGHTHOUSE_HOST`` from the
    downward API's ``status.podIP``), restarted on the same port if it crashes, stopping once the
    job has finished (``--until-finished``: the pod completes, and with it the job)."""
    el = spec.elastic
    argv = jobdir.lighthouse_argv("python", pod_job_dir(job_id, mount), min_replicas=el.min_nodes if el.enabled else 1,
                                  host="")
    argv = argv[:argv.index("--host")]  # the address comes from $HYPERPOD_LAB_LIGHTHOUSE_HOST
    return [*map(k8s_literal, argv), f"--port={LIGHTHOUSE_PORT}", "--until-finished"]


def agent_command(spec: JobSpec, job_id: str, mount: str) -> list[str]:
    """A restart-mode HyperPod pod's command (pure): ``hyperpodrun`` (the operator's agent: it
    keeps the rendezvous, ``--rdzv-backend=hyperpod``, and the operator's process-level and job
    restarts) starts ONE process per pod, our launch agent, which runs the pod's
    ``procs_per_node`` ranks with the hang watchdog, straggler detection and events, joining the
    other pods' agents at the address and node rank torchrun's environment gives hyperpodrun's
    worker (``MASTER_ADDR``/``MASTER_PORT``, ``GROUP_RANK``, ``WORLD_SIZE`` = pods: torch
    ``torch/distributed/elastic/agent/server/api.py``, ``_assign_worker_ranks`` and the worker
    env of ``local_elastic_agent.py``; that worker runs no process group, so its ``MASTER_PORT`` is
    free for our agent's static rendezvous). ``--max-restarts=0``: a failed or hung rank ends our
    agent, hyperpodrun reports the fault and the operator restarts (its ``restartPolicy``), as
    before; the runtime resumes from its newest checkpoint tier. No ``--inprocess-restart`` (that
    needs HyperPod's own in-process wrapper in the script; ours is the runtime's). The script's
    arguments reach it as ``"$@"``, never as shell text; every ``$`` is doubled for the kubelet."""
    el = spec.elastic
    paths = JobPaths(pod_job_dir(job_id, mount))
    launch = jobdir.launcher_argv("python", _script_path(spec), [], nproc_per_node=spec.procs_per_node,
                                  max_restarts=0, log_dir=shlex.quote(paths.torchrun_logs),
                                  nnodes='"$WORLD_SIZE"', rdzv=['--node-rank="$GROUP_RANK"',
                                                                '--master-addr="$MASTER_ADDR"',
                                                                '--master-port="$MASTER_PORT"'],
                                  monitor_interval=0.1, quote=shlex.quote)
    script = "exec " + " ".join(launch) + ' "$@"'
    return ["hyperpodrun", f"--nnodes={el.min_nodes}:{el.max_nodes}" if el.enabled else f"--nnodes={spec.nodes}",
            "--nproc-per-node=1", "--rdzv-backend=hyperpod", "--tee=3",
            f"--log-dir={paths.hyperpodrun_logs}", "--no-python", "/bin/sh", "-c", k8s_literal(script),
            "hyperpod-lab-agent", *map(k8s_literal, spec.args)]


def _checkpointless_templates(spec: JobSpec, job_id: str, profile: ClusterProfile,
                              hyperpod: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Lighthouse's pod template, a replica group's pod template)."""
    mount = profile.shared_mount or DEFAULT_SHARED_MOUNT
    res = spec.resiliency
    lighthouse = _pod_template(spec, job_id, profile, lighthouse_command(spec, job_id, mount), "pytorch",
                               LIGHTHOUSE_PORT, False, hyperpod=hyperpod,
                               fields={jobdir.ENV_LIGHTHOUSE_HOST: "status.podIP"}, role=ROLE_LIGHTHOUSE)
    group = _pod_template(spec, job_id, profile, group_command(spec, job_id, mount), "pytorch", None,
                          res.deep_health_check, hyperpod=hyperpod,
                          env={jobdir.ENV_REPLICA_GROUPS: str(spec.nodes),
                               TORCHFT_LIGHTHOUSE_ENV: lighthouse_url(job_id, profile)},
                          fields={POD_NAME_ENV: "metadata.name"}, role=ROLE_GROUP)
    return lighthouse, group


def render_lighthouse_service(spec: JobSpec, job_id: str, profile: ClusterProfile) -> dict[str, Any]:
    """The ``Service`` (``v1``, ClusterIP) in front of a checkpointless job's Lighthouse pod: it
    selects the pod by the job's label and :data:`ROLE_LABEL` = ``lighthouse`` and forwards
    :data:`LIGHTHOUSE_PORT`, so the groups' ``$TORCHFT_LIGHTHOUSE`` (:func:`lighthouse_url`)
    stays valid when the operator recreates the Lighthouse pod at another address."""
    name = resource_name(job_id)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": lighthouse_service_name(job_id), "namespace": profile.namespace or DEFAULT_NAMESPACE,
                         "labels": {JOB_ID_LABEL: name, "app.kubernetes.io/managed-by": "hyperpod-lab"}},
            "spec": {"selector": {JOB_ID_LABEL: name, ROLE_LABEL: ROLE_LIGHTHOUSE},
                     "ports": [{"name": "lighthouse", "port": LIGHTHOUSE_PORT, "targetPort": LIGHTHOUSE_PORT,
                                "protocol": "TCP"}]}}


def _metadata(spec: JobSpec, job_id: str, profile: ClusterProfile) -> dict[str, Any]:
    return {"name": resource_name(job_id), "namespace": profile.namespace or DEFAULT_NAMESPACE,
            "labels": {JOB_ID_LABEL: resource_name(job_id), "app.kubernetes.io/managed-by": "hyperpod-lab"},
            "annotations": {"hyperpod-lab.io/job-name": spec.name, "hyperpod-lab.io/version": __version__}}


def render_hyperpod_pytorch_job(spec: JobSpec, job_id: str, profile: ClusterProfile) -> dict[str, Any]:
    """``spec`` as a ``HyperPodPyTorchJob`` (pure).

    Mapping: ``nodes`` -> ``replicaSpecs[0].replicas`` (``maxReplicas`` = elastic max);
    ``procs_per_node`` -> ``nprocPerNode``; resiliency -> ``runPolicy.jobMaxRetryCount``
    (``max_retries``, 0 without ``auto_resume``) and ``runPolicy.restartPolicy`` (process-level
    restarts first, then full-job restarts; the pods run
    ``hyperpodrun --rdzv-backend=hyperpod``); hang detection -> ``runPolicy.logMonitoringConfiguration``
    on :data:`STEP_LOG_PATTERN`; nodes: the node-health label HyperPod documents for
    scheduling (:data:`NODE_HEALTH_LABEL` = ``Schedulable``), plus the deep-health-check label
    with ``resiliency.deep_health_check`` only (it exists only on nodes that ran one);
    ``/dev/shm`` memory-backed (profile ``shm_size``); EFA devices and ``FI_*`` with profile
    ``efa``; ``runPolicy.ttlSecondsAfterFinished`` so the final status can be read;
    elastic -> ``elasticPolicy`` (min/max replicas, increment step 1); ``resiliency.spares`` ->
    ``replicaSpecs[0].spares``; the checkpoint policy
    reaches the runtime through ``$HYPERPOD_LAB_SPEC`` (the ConfigMap's ``spec.json``).

    Args:
        spec: a validated JobSpec.
        job_id: hyperpod-lab job id.
        profile: the eks cluster profile (``image``, ``pvc``, ``shared_mount``, ``namespace``).

    Returns:
        The custom resource as a dict (``apiVersion``, ``kind``, ``metadata``, ``spec``).

    Raises:
        ConfigError: the profile lacks ``image`` or ``pvc``.
        SpecError: a checkpointless job with ``resiliency.spares`` (hot spares run on Slurm only).

    Checkpointless (``resiliency.recovery``): a ``lighthouse`` replica (the Lighthouse's pod,
    behind :func:`render_lighthouse_service`) before the ``workers``, one pod per replica group
    running our launch agent (:func:`group_command`), and ``maxFullJobRestarts: 0``: a fault
    restarts the faulty pod, never the live groups.
    """
    _check_supported(spec)
    el, res = spec.elastic, spec.resiliency
    max_nodes = el.max_nodes if el.enabled else spec.nodes
    retries = jobdir.effective_restarts(res)
    mount = profile.shared_mount or DEFAULT_SHARED_MOUNT
    checkpointless = is_checkpointless(spec)
    command = agent_command(spec, job_id, mount)
    replicas: list[dict[str, Any]] = []
    if checkpointless:  # the Lighthouse's pod, then one pod per replica group running our launch agent
        lighthouse, tmpl = _checkpointless_templates(spec, job_id, profile, hyperpod=True)
        replicas.append({"name": LIGHTHOUSE_REPLICA, "replicas": 1, "template": lighthouse})
    else:
        tmpl = _pod_template(spec, job_id, profile, command, "pytorch", AGENT_PORT, res.deep_health_check)
    replica: dict[str, Any] = {"name": "workers", "replicas": spec.nodes, "template": tmpl}
    replicas.append(replica)
    if el.enabled:
        replica["maxReplicas"] = max_nodes
    if res.spares:
        # the operator keeps this many spare pods to replace a faulty one (FACTS.md: the SDK
        # model's replicaSpecs[].spares)
        replica["spares"] = res.spares
    check_pod_names(job_id, max_nodes + res.spares)
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "All",
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
        "jobMaxRetryCount": retries,
        "logMonitoringConfiguration": [
            {"name": "JobStart", "logPattern": STEP_LOG_PATTERN, "expectedStartCutOffInSeconds": START_CUTOFF_S},
            {"name": "JobHangingDetection", "logPattern": STEP_LOG_PATTERN,
             "expectedRecurringFrequencyInSeconds": hang_after_s(spec)},
        ],
    }
    if retries:
        # checkpointless: a fault restarts the faulty pod only (the live groups hold the state and
        # heal it), never the whole job, which would drop every live copy
        run_policy["restartPolicy"] = {"evalPeriodSeconds": RESTART_EVAL_PERIOD_S,
                                       "numRestartBeforeFullJobRestart": retries,
                                       "maxFullJobRestarts": 0 if checkpointless else 1}
    if spec.time_limit_min:
        run_policy["activeDeadlineSeconds"] = spec.time_limit_min * 60
    # restart mode: hyperpodrun starts one process per pod, our launch agent (agent_command)
    body: dict[str, Any] = {"nprocPerNode": str(spec.procs_per_node) if checkpointless else "1",
                            "replicaSpecs": replicas, "runPolicy": run_policy}
    if el.enabled:
        body["elasticPolicy"] = {"minReplicas": el.min_nodes, "maxReplicas": el.max_nodes,
                                 "replicaIncrementStep": 1,
                                 "gracefulShutdownTimeoutInSeconds": GRACEFUL_SHUTDOWN_S}
    return {"apiVersion": f"{HYPERPOD_GROUP}/{HYPERPOD_VERSION}", "kind": HYPERPOD_KIND,
            "metadata": _metadata(spec, job_id, profile), "spec": body}


def render_kubeflow_pytorch_job(spec: JobSpec, job_id: str, profile: ClusterProfile) -> dict[str, Any]:
    """``spec`` as a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``; pure).

    One ``Master`` replica and ``nodes - 1`` ``Worker`` replicas (elastic: ``nodes`` ``Worker``
    replicas only, the kind the operator scales), ``nprocPerNode`` = ``procs_per_node``;
    elastic -> ``elasticPolicy`` {rdzvBackend: c10d, minReplicas, maxReplicas, maxRestarts};
    ``runPolicy.backoffLimit`` = ``max_retries``. Same environment,
    volumes and node selector as :func:`render_hyperpod_pytorch_job`. Checkpointless: the
    ``Master`` is the Lighthouse's pod (the job succeeds when it exits 0, once training finished),
    ``Worker`` i is replica group i (:func:`group_command`), both ``restartPolicy: OnFailure``;
    elastic -> ``elasticPolicy`` without ``rdzvBackend`` (no rendezvous across pods).

    Raises:
        ConfigError: the profile lacks ``image`` or ``pvc``.
        SpecError: ``resiliency.spares`` (no spare replicas in a PyTorchJob).
    """
    _check_supported(spec)
    if spec.resiliency.spares:
        raise SpecError("resiliency.spares", "the Kubeflow PyTorchJob has no spare replicas; submit with --spares 0, "
                                             "or to a HyperPod cluster (HyperPodPyTorchJob replicaSpecs[].spares)")
    el, res = spec.elastic, spec.resiliency
    retries = jobdir.effective_restarts(res)
    mount = profile.shared_mount or DEFAULT_SHARED_MOUNT
    command = jobdir.launcher_argv("python", _script_path(spec), spec.args, nnodes=None,
                                   nproc_per_node=spec.procs_per_node, max_restarts=retries,
                                   log_dir=JobPaths(pod_job_dir(job_id, mount)).torchrun_logs, redirects=False,
                                   quote=k8s_literal)
    check_pod_names(job_id, el.max_nodes if el.enabled else spec.nodes)
    restart = "OnFailure" if retries else "Never"
    replicas: dict[str, Any]
    if is_checkpointless(spec):
        # Master: the Lighthouse (the job succeeds when its Master does, and it exits 0 once the
        # training finished); Worker i: replica group i. OnFailure: the kubelet restarts a failed
        # group's container in its pod, and the operator recreates a deleted pod under its name:
        # one group restarts, the others go on
        lighthouse, tmpl = _checkpointless_templates(spec, job_id, profile, hyperpod=False)
        replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": lighthouse},
                    "Worker": {"replicas": spec.nodes, "restartPolicy": restart, "template": tmpl}}
    else:
        tmpl = _pod_template(spec, job_id, profile, command, "pytorch", None, res.deep_health_check, hyperpod=False)
        if el.enabled:  # an elastic job scales its Worker replicas; a Master cannot scale
            replicas = {"Worker": {"replicas": spec.nodes, "restartPolicy": restart, "template": tmpl}}
        else:
            replicas = {"Master": {"replicas": 1, "restartPolicy": restart, "template": tmpl}}
            if spec.nodes > 1:
                replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": restart,
                                      "template": copy.deepcopy(tmpl)}  # no YAML anchors in the output
    body: dict[str, Any] = {"nprocPerNode": str(spec.procs_per_node), "pytorchReplicaSpecs": replicas,
                            "runPolicy": {"cleanPodPolicy": "All", "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
                                          "backoffLimit": retries}}
    if spec.time_limit_min:
        body["runPolicy"]["activeDeadlineSeconds"] = spec.time_limit_min * 60
    if el.enabled:
        body["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": el.min_nodes, "maxReplicas": el.max_nodes,
                                 "maxRestarts": retries}
        if is_checkpointless(spec):  # no torchrun rendezvous across pods: the Lighthouse's quorum
            del body["elasticPolicy"]["rdzvBackend"]
    return {"apiVersion": f"{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}", "kind": KUBEFLOW_KIND,
            "metadata": _metadata(spec, job_id, profile), "spec": body}


def render_job_configmap(spec: JobSpec, job_id: str, profile: ClusterProfile, script_bytes: bytes) -> dict[str, Any]:
    """The ConfigMap holding the training script and ``spec.json``, mounted at :data:`JOB_MOUNT`.

    Raises:
        SpecError: the script's file name is not a valid ConfigMap key, it is not UTF-8 text, or
            it is larger than 1 MiB (a ConfigMap's limit).
    """
    key = posixpath.basename(spec.script)
    if not re.fullmatch(r"[-._a-zA-Z0-9]+", key) or key in (SPEC_KEY, ".", ".."):
        raise SpecError("script", f"the file name {key!r} cannot be a ConfigMap key; rename the script to "
                                  f"letters, digits, '-', '_' and '.' (e.g. train.py)")
    try:
        text = script_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("script", f"{spec.script} is not UTF-8 text; EKS jobs ship the script in a ConfigMap") from None
    spec_json = spec.to_json()
    if len(script_bytes) + len(spec_json) > CONFIGMAP_MAX_BYTES - 4096:
        raise SpecError("script", f"{spec.script} is {len(script_bytes)} bytes; a ConfigMap holds at most 1 MiB. "
                                  f"Put large code on the FSx volume ({profile.shared_mount or DEFAULT_SHARED_MOUNT}) "
                                  f"and submit a small entry script")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": configmap_name(job_id), "namespace": profile.namespace or DEFAULT_NAMESPACE,
                         "labels": {JOB_ID_LABEL: resource_name(job_id), "app.kubernetes.io/managed-by": "hyperpod-lab"}},
            "data": {key: text, SPEC_KEY: spec_json}}


def render_job_secret(spec: JobSpec, job_id: str, profile: ClusterProfile, secrets: dict[str, str]) -> dict[str, Any]:
    """The Secret holding ``spec.secret_env``'s values (``secrets``), which the pods read by
    ``secretKeyRef``. Never printed by ``--dry-run``.

    Raises:
        SpecError: a name of ``spec.secret_env`` has no value in ``secrets`` (field ``secret_env``).
    """
    missing = [k for k in spec.secret_env if k not in secrets]
    if missing:
        raise SpecError("secret_env", f"no value for {', '.join(missing)}")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(job_id), "namespace": profile.namespace or DEFAULT_NAMESPACE,
                         "labels": {JOB_ID_LABEL: resource_name(job_id), "app.kubernetes.io/managed-by": "hyperpod-lab"}},
            "data": {k: base64.b64encode(secrets[k].encode()).decode() for k in spec.secret_env}}


def render_job(spec: JobSpec, job_id: str, profile: ClusterProfile) -> dict[str, Any]:
    """The profile's operator's resource: HyperPodPyTorchJob (default) or Kubeflow PyTorchJob."""
    if is_kubeflow(profile):
        return render_kubeflow_pytorch_job(spec, job_id, profile)
    return render_hyperpod_pytorch_job(spec, job_id, profile)


def to_yaml(*resources: dict[str, Any]) -> str:
    """Resources as one multi-document YAML text (keys in rendering order; multi-line strings
    such as the script as literal ``|`` blocks), as ``--dry-run`` prints."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return "".join("---\n" + yaml.dump(r, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=1000)
                   for r in resources)
