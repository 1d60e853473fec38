"""Kubernetes manifests of a JobSpec (pure renderers, golden-file tested).

Two custom resources run the same JobSpec on an EKS cluster:

* ``HyperPodPyTorchJob`` (``sagemaker.amazonaws.com/v1``) for clusters with the SageMaker
  HyperPod training operator. The pods run ``hyperpodrun`` (the HyperPod elastic agent, a
  torchrun superset; it listens on container port 8080 for the operator).
* ``PyTorchJob`` (``kubeflow.org/v1``) for EKS clusters without it. The pods run our
  launcher (``python -m hyperpod_lab.node.launch``, torchrun plus fault/recovery events);
  the Kubeflow operator passes the rendezvous settings as ``PET_*`` environment variables,
  which torchrun's parser reads.

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
from typing import Any

from hyperpod_lab import jobdir
from hyperpod_lab._version import __version__
from hyperpod_lab.errors import ConfigError, SpecError
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.spec import RECOVERY_RESTART, JobSpec
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


def job_env(spec: JobSpec, job_id: str, shared_mount: str) -> list[dict[str, str]]:
    """The container environment: the same ``HYPERPOD_LAB_*`` variables ``render_sbatch``
    exports (job id, job dir, spec path, shared root), then the spec's own ``env``."""
    env = {
        **jobdir.job_env(job_id, pod_job_dir(job_id, shared_mount), posixpath.join(JOB_MOUNT, SPEC_KEY), shared_mount),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    env.update(spec.env)
    out: list[dict[str, Any]] = [{"name": k, "value": k8s_literal(v)} for k, v in env.items()]
    # secrets by reference: the values live in the job's Secret, never in the pod spec
    out += [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name(job_id), "key": k}}}
            for k in spec.secret_env]
    return out


def _script_path(spec: JobSpec) -> str:
    return posixpath.join(JOB_MOUNT, posixpath.basename(spec.script))


def _pod_template(spec: JobSpec, job_id: str, profile: ClusterProfile, command: list[str],
                  container: str, port: int | None, deep_health_check: bool,
                  hyperpod: bool = True) -> dict[str, Any]:
    image = _require(profile, "image", '"123456789012.dkr.ecr.us-west-2.amazonaws.com/train:latest"')
    pvc = _require(profile, "pvc", '"fsx-claim"')
    mount = profile.shared_mount or DEFAULT_SHARED_MOUNT
    c: dict[str, Any] = {
        "name": container,
        "image": image,
        "command": command,
        "env": job_env(spec, job_id, mount),
        "volumeMounts": [{"name": "fsx", "mountPath": mount},
                         {"name": "job", "mountPath": JOB_MOUNT, "readOnly": True}],
    }
    if port is not None:
        c["ports"] = [{"containerPort": port}]
    devices: dict[str, int] = {}
    if profile.gpus_per_node:
        devices["nvidia.com/gpu"] = int(profile.gpus_per_node)
    if profile.efa:  # EFA devices and the libfabric settings AWS's examples pass with them
        devices[EFA_RESOURCE] = int(profile.efa_per_node)
        c["env"] = [{"name": k, "value": v} for k, v in EFA_ENV.items() if k not in spec.env] + c["env"]
    if devices:
        c["resources"] = {"limits": dict(devices), "requests": dict(devices)}
    # /dev/shm memory-backed (as AWS's examples mount it): the memory checkpoint tier lives there,
    # NCCL and DataLoader workers use it; a container's own /dev/shm is 64 MiB
    c["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    shm: dict[str, Any] = {"medium": "Memory"}
    if profile.shm_size:
        shm["sizeLimit"] = profile.shm_size
    pod: dict[str, Any] = {
        "containers": [c],
        "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": pvc}},
                    {"name": "job", "configMap": {"name": configmap_name(job_id)}},
                    {"name": "dshm", "emptyDir": shm}],
    }
    selector = {NODE_HEALTH_LABEL: NODE_SCHEDULABLE} if hyperpod else {}
    if deep_health_check:
        selector[DEEP_HEALTH_CHECK_LABEL] = "Passed"
    if selector:
        pod["nodeSelector"] = selector
    return {"metadata": {"labels": {JOB_ID_LABEL: resource_name(job_id)}}, "spec": pod}


def _check_supported(spec: JobSpec) -> None:
    if getattr(spec.resiliency, "recovery", RECOVERY_RESTART) != RECOVERY_RESTART:
        raise SpecError("resiliency.recovery", f"{spec.resiliency.recovery!r} recovery is not available on EKS yet "
                                               f"(only 'restart'); submit with --recovery restart, or to a Slurm cluster")


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
        SpecError: ``resiliency.recovery`` is not ``restart`` (checkpointless runs on Slurm only).
    """
    _check_supported(spec)
    el, res = spec.elastic, spec.resiliency
    max_nodes = el.max_nodes if el.enabled else spec.nodes
    retries = jobdir.effective_restarts(res)
    mount = profile.shared_mount or DEFAULT_SHARED_MOUNT
    # the operator coordinates the rendezvous (--rdzv-backend hyperpod). No --inprocess-restart:
    # that mode needs the script to handle restarts in process; ours restarts the processes and
    # the runtime resumes from its newest checkpoint tier.
    command = ["hyperpodrun", f"--nnodes={el.min_nodes}:{el.max_nodes}" if el.enabled else f"--nnodes={spec.nodes}",
               f"--nproc-per-node={spec.procs_per_node}", "--rdzv-backend=hyperpod", "--tee=3",
               f"--log-dir={JobPaths(pod_job_dir(job_id, mount)).hyperpodrun_logs}"]
    command += [k8s_literal(_script_path(spec)), *map(k8s_literal, spec.args)]
    replica: dict[str, Any] = {
        "name": "workers", "replicas": spec.nodes,
        "template": _pod_template(spec, job_id, profile, command, "pytorch", AGENT_PORT, res.deep_health_check),
    }
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
        run_policy["restartPolicy"] = {"evalPeriodSeconds": RESTART_EVAL_PERIOD_S,
                                       "numRestartBeforeFullJobRestart": retries,
                                       "maxFullJobRestarts": 1}
    if spec.time_limit_min:
        run_policy["activeDeadlineSeconds"] = spec.time_limit_min * 60
    body: dict[str, Any] = {"nprocPerNode": str(spec.procs_per_node), "replicaSpecs": [replica],
                            "runPolicy": run_policy}
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
    volumes and node selector as :func:`render_hyperpod_pytorch_job`.

    Raises:
        ConfigError: the profile lacks ``image`` or ``pvc``.
        SpecError: ``resiliency.recovery`` is not ``restart`` (checkpointless runs on Slurm only).
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
    tmpl = _pod_template(spec, job_id, profile, command, "pytorch", None, res.deep_health_check, hyperpod=False)
    if el.enabled:  # an elastic job scales its Worker replicas; a Master cannot scale
        replicas: dict[str, Any] = {"Worker": {"replicas": spec.nodes, "restartPolicy": restart, "template": tmpl}}
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
    if (profile.operator or "hyperpod") == "kubeflow":
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
