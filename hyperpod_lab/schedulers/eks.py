"""EKS backend: a JobSpec as a HyperPodPyTorchJob (or Kubeflow PyTorchJob) custom resource.

Talks to the Kubernetes API through the ``kubernetes`` Python client, authenticated either by a
kubeconfig context (``kube_context`` / ``kubeconfig`` in the cluster profile) or, for
``eks_cluster`` + ``region``, by an EKS bearer token made with boto3 exactly as
``aws eks get-token`` makes it (:func:`eks_token`) plus the endpoint and CA from
``eks.describe_cluster``. Nothing is contacted until the first API call, so ``--dry-run`` works
offline.

The operator's view of the job (``status.conditions``, ``restartCount``,
``latestFaultyPodInstanceList``, ``elasticScalingStatus``) becomes events of the writer
``operator`` in the job's local directory (:func:`status_events`), so the sidebar, widgets and
``EventReader`` show faults and recoveries the operator saw like those the runtime writes. The
local job directory is ``<shared_root>/hyperpod-lab/jobs/<job id>`` when the profile sets
``shared_root`` (the FSx file system mounted on the notebook host: the runtime's own events
appear there too), else ``<data dir>/eks/<cluster>/<job id>``.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import posixpath
import tempfile
import threading
import time
from typing import Any, Iterator

from hyperpod_lab.clusters import ClusterProfile, data_dir
from hyperpod_lab.errors import ClusterUnreachable, ConfigError, HyperPodLabError, JobStateError
from hyperpod_lab.events import Event, EventKind, EventWriter
from hyperpod_lab.jobs import JobRecord, JobStatus
from hyperpod_lab.schedulers import k8s_manifest as km
from hyperpod_lab.schedulers.base import JOBS_SUBDIR, Scheduler
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.spec import JobSpec

OPERATOR_WRITER = "operator"
STATE_FILE = "operator-state.json"
CANCELLED_MARKER = "cancelled"
TOKEN_PREFIX = "k8s-aws-v1."
TOKEN_LIFETIME_S = 60  # presigned URL expiry; EKS accepts a token for up to 15 minutes
TOKEN_REFRESH_S = 600

_COMPLETED = ("Completed", "Succeeded")
_FAILED = ("Failed",)
_RUNNING = ("Running", "PodsRunning")
_RESTARTING = ("Restarting",)


# ---- authentication ------------------------------------------------------------------------
def eks_token(cluster_name: str, region: str, session: Any = None) -> str:
    """A bearer token for an EKS cluster's API server, as ``aws eks get-token`` makes it.

    The token is ``k8s-aws-v1.`` + base64url (no padding) of a presigned STS
    ``GetCallerIdentity`` URL whose signed headers include ``x-k8s-aws-id: <cluster_name>``;
    EKS calls that URL to learn the caller's IAM identity. Valid for 15 minutes.

    Args:
        cluster_name: EKS cluster name.
        region: its AWS region.
        session: a ``boto3.Session`` (default: a new one, using the standard credential chain).

    Raises:
        ConfigError: no AWS credentials (names ``aws configure`` / ``AWS_PROFILE``).
    """
    import boto3
    import botocore.exceptions

    session = session or boto3.Session()
    sts = session.client("sts", region_name=region)

    def add_cluster_header(request, **_):
        request.headers["x-k8s-aws-id"] = cluster_name

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_cluster_header)
    try:
        url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=TOKEN_LIFETIME_S,
                                         HttpMethod="GET")
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError("no AWS credentials to make an EKS token; run 'aws configure' or set AWS_PROFILE "
                          "(or use a kubeconfig context: kube_context in the cluster profile)") from None
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def kube_configuration(profile: ClusterProfile):
    """A ``kubernetes.client.Configuration`` for the profile (kubeconfig context, or EKS token).

    Raises:
        ConfigError: the kubeconfig/context cannot be loaded, or no AWS credentials.
        ClusterUnreachable: ``eks.describe_cluster`` failed (wrong name or region, no network).
    """
    from kubernetes import client as kclient, config as kconfig

    cfg = kclient.Configuration()
    if profile.kube_context or profile.kubeconfig:
        try:
            kconfig.load_kube_config(config_file=os.path.expanduser(profile.kubeconfig) if profile.kubeconfig else None,
                                     context=profile.kube_context, client_configuration=cfg)
        except (kconfig.ConfigException, OSError, TypeError) as e:
            raise ConfigError(f"cluster profile '{profile.name}': cannot load kubeconfig "
                              f"{profile.kubeconfig or '$KUBECONFIG / ~/.kube/config'} context "
                              f"{profile.kube_context or '(current)'}: {e}. Fix 'kube_context'/'kubeconfig', or "
                              f"run 'aws eks update-kubeconfig --name CLUSTER --region REGION'") from None
        if profile.api_server:
            cfg.host = profile.api_server
            inner = cfg.refresh_api_key_hook  # the kubeconfig loader's hook resets host on each request

            def keep_host(conf):
                if inner:
                    inner(conf)
                conf.host = profile.api_server

            cfg.refresh_api_key_hook = keep_host
        return cfg
    import boto3
    import botocore.exceptions

    session = boto3.Session(profile_name=profile.aws_profile) if profile.aws_profile else boto3.Session()
    endpoint, ca_file = profile.api_server, None
    try:
        desc = session.client("eks", region_name=profile.region).describe_cluster(name=profile.eks_cluster)["cluster"]
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError("no AWS credentials to reach EKS; run 'aws configure' or set AWS_PROFILE") from None
    except botocore.exceptions.ClientError as e:
        raise ClusterUnreachable(f"eks.describe_cluster({profile.eks_cluster!r}) in {profile.region} failed: "
                                 f"{e.response.get('Error', {}).get('Message', e)}; check 'eks_cluster' and 'region' "
                                 f"of cluster profile '{profile.name}'") from None
    except botocore.exceptions.EndpointConnectionError as e:
        raise ClusterUnreachable(f"cannot reach the EKS API in {profile.region}: {e}") from None
    endpoint = endpoint or desc.get("endpoint")
    ca = (desc.get("certificateAuthority") or {}).get("data")
    if ca:
        fd, ca_file = tempfile.mkstemp(prefix="hyperpod-lab-eks-ca-", suffix=".crt")
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(ca))
        atexit.register(_unlink_quietly, ca_file)
    if not endpoint:
        raise ClusterUnreachable(f"EKS cluster {profile.eks_cluster!r} has no API endpoint yet (is it ACTIVE?)")
    cfg.host = endpoint
    if ca_file:
        cfg.ssl_ca_cert = ca_file
    made = [0.0]

    def refresh(conf):
        if time.time() - made[0] > TOKEN_REFRESH_S:
            conf.api_key["authorization"] = eks_token(profile.eks_cluster, profile.region, session)
            made[0] = time.time()

    cfg.api_key_prefix["authorization"] = "Bearer"
    cfg.refresh_api_key_hook = refresh
    refresh(cfg)
    return cfg


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ---- status -> events (pure) -----------------------------------------------------------------
def job_status(obj: dict[str, Any] | None, cancelled: bool = False) -> tuple[JobStatus, int | None, str | None]:
    """Our JobStatus from a custom resource's ``status`` (``conditions``: the newest True one wins).

    ``None`` (the resource is gone) is CANCELLED when we cancelled it, else FAILED.
    """
    if obj is None:
        return ((JobStatus.CANCELLED, None, "cancelled") if cancelled
                else (JobStatus.FAILED, None, "the job's resource was deleted outside hyperpod-lab"))
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    if not conds:
        return JobStatus.PENDING, None, None
    last = sorted(conds, key=lambda c: c.get("lastTransitionTime") or "")[-1]
    kind, reason = last.get("type"), last.get("message") or last.get("reason")
    if kind in _COMPLETED:
        return JobStatus.COMPLETED, 0, reason
    if kind in _FAILED:
        return JobStatus.FAILED, None, reason
    if kind in _RUNNING or kind in _RESTARTING:
        return JobStatus.RUNNING, None, reason
    return JobStatus.PENDING, None, reason


def status_events(prev: dict[str, Any], obj: dict[str, Any] | None, procs_per_node: int, now: float,
                  cancelled: bool = False) -> tuple[list[tuple[EventKind, dict[str, Any]]], dict[str, Any]]:
    """Events the operator's status implies since ``prev`` (pure; ``prev`` = ``{}`` at first).

    * first Running condition -> ``started`` {nodes, world_size, source};
    * ``restartCount`` up -> ``fault.detected`` {rank, ranks, pods, instances, restart_type (PLR:
      process-level, JLR: job-level), restart_count, reason, source} and ``recovery.started``
      {restart_count, reason, node: null, source};
    * Running again after a restart -> ``recovery.completed`` {restart_count, downtime_s (seconds
      from the ``Restarting`` condition to the ``Running`` one after it, by their
      ``lastTransitionTime``; else from when the fault was first seen to ``now``),
      restored_step: null, restored_from: null, source};
    * ``elasticScalingStatus.targetReplicas`` changed -> ``elastic.scaled`` {old_nodes, new_nodes,
      old_world_size, new_world_size, source};
    * a terminal condition (or the resource gone) -> ``finished`` {status, exit_code, reason, source}.

    Returns:
        (events as (kind, data) pairs, the new state to pass as ``prev`` next time).
    """
    st = dict(prev)
    out: list[tuple[EventKind, dict[str, Any]]] = []
    src = {"source": "operator"}
    if st.get("finished"):
        return out, st
    state, code, reason = job_status(obj, cancelled)
    status = (obj or {}).get("status") or {}
    if state == JobStatus.RUNNING and not st.get("started"):
        nodes = _replicas(obj)
        out.append((EventKind.STARTED, {"nodes": nodes, "world_size": nodes * procs_per_node, **src}))
        st["started"] = True
        st["nodes"] = nodes
    restarts = int(status.get("restartCount") or 0)
    if restarts > int(st.get("restart_count", 0)):
        faulty = status.get("latestFaultyPodInstanceList") or {}
        ranks = [int(r) for r in faulty.get("faultyRankList") or [] if str(r).lstrip("-").isdigit()]
        rtype = faulty.get("restartType")
        out.append((EventKind.FAULT_DETECTED, {
            "rank": ranks[0] if ranks else None, "ranks": ranks, "pods": list(faulty.get("faultyPodList") or []),
            "instances": list(faulty.get("faultyInstanceIdList") or []), "restart_type": rtype,
            "restart_count": restarts, "node": None,
            "reason": f"the operator restarted the job ({rtype or 'restart'}), restart {restarts}", **src}))
        out.append((EventKind.RECOVERY_STARTED, {"restart_count": restarts, "node": None,
                                                 "reason": f"operator restart ({rtype or 'unknown'})", **src}))
        st["restart_count"] = restarts
        st.setdefault("fault_time", now)
        st["recovering"] = True
    running_now = state == JobStatus.RUNNING and _newest_true(obj) in _RUNNING
    if st.get("recovering") and running_now:
        fault_t, back_t = _cond_time(obj, _RESTARTING), _cond_time(obj, _RUNNING)
        t0 = st.pop("fault_time", now)
        downtime = back_t - fault_t if fault_t is not None and back_t is not None and back_t >= fault_t else now - t0
        out.append((EventKind.RECOVERY_COMPLETED, {
            "restart_count": st.get("restart_count", 0), "downtime_s": round(downtime, 3),
            "restored_step": None, "restored_from": None, **src}))
        st["recovering"] = False
    target = (status.get("elasticScalingStatus") or {}).get("targetReplicas")
    if isinstance(target, dict) and target:
        new = sum(int(v) for v in target.values())
        old = int(st.get("nodes") or _replicas(obj))
        if new != old:
            out.append((EventKind.ELASTIC_SCALED, {"old_nodes": old, "new_nodes": new,
                                                   "old_world_size": old * procs_per_node,
                                                   "new_world_size": new * procs_per_node, **src}))
        st["nodes"] = new
    if state.is_terminal():
        out.append((EventKind.FINISHED, {"status": {JobStatus.COMPLETED: "succeeded"}.get(state, state.value),
                                         "exit_code": code, "reason": reason, **src}))
        st["finished"] = True
    return out, st


def _cond_time(obj: dict[str, Any] | None, types: tuple[str, ...]) -> float | None:
    """Epoch seconds of the newest condition of one of ``types`` (its ``lastTransitionTime``)."""
    from datetime import datetime

    times = []
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") in types and c.get("lastTransitionTime"):
            try:
                times.append(datetime.fromisoformat(str(c["lastTransitionTime"]).replace("Z", "+00:00")).timestamp())
            except ValueError:
                pass
    return max(times) if times else None


def _newest_true(obj: dict[str, Any] | None) -> str | None:
    conds = [c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    return sorted(conds, key=lambda c: c.get("lastTransitionTime") or "")[-1].get("type") if conds else None


def _replicas(obj: dict[str, Any] | None) -> int:
    spec = (obj or {}).get("spec") or {}
    if "replicaSpecs" in spec:
        return sum(int(r.get("replicas") or 0) for r in spec["replicaSpecs"])
    return sum(int(r.get("replicas") or 0) for r in (spec.get("pytorchReplicaSpecs") or {}).values())


# ---- the scheduler ---------------------------------------------------------------------------
class EksScheduler(Scheduler):
    """HyperPod (or Kubeflow) jobs on EKS. ``native_id`` is ``<namespace>/<resource name>``.

    Args:
        profile: an ``eks`` cluster profile.
        remote: where the local job directories live (default :class:`LocalRemote`).
        api_client: a ready ``kubernetes.client.ApiClient`` (default: built from the profile on
            first use).
    """

    def __init__(self, profile: ClusterProfile, remote=None, api_client=None):
        super().__init__(profile, remote or LocalRemote())
        self._api = api_client
        self._lock = threading.Lock()

    # -- Kubernetes API ----------------------------------------------------------------------
    @property
    def api(self):
        with self._lock:
            if self._api is None:
                from kubernetes import client as kclient

                self._api = kclient.ApiClient(kube_configuration(self.profile))
            return self._api

    @property
    def _custom(self):
        from kubernetes import client as kclient

        return kclient.CustomObjectsApi(self.api)

    @property
    def _core(self):
        from kubernetes import client as kclient

        return kclient.CoreV1Api(self.api)

    def _gvp(self) -> tuple[str, str, str]:
        if (self.profile.operator or "hyperpod") == "kubeflow":
            return km.KUBEFLOW_GROUP, km.KUBEFLOW_VERSION, km.KUBEFLOW_PLURAL
        return km.HYPERPOD_GROUP, km.HYPERPOD_VERSION, km.HYPERPOD_PLURAL

    def _call(self, what: str, fn, *args, **kwargs):
        """Run one API call; map transport and auth errors to our error types."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            if e.status in (401, 403):
                raise ConfigError(f"the Kubernetes API of cluster '{self.profile.name}' refused {what} "
                                  f"({e.status} {e.reason}); check your credentials (kube_context, or the IAM "
                                  f"identity mapped into the cluster) and RBAC for {self._gvp()[2]}") from None
            if e.status == 404 and not what.startswith("creating"):
                raise  # callers decide what a missing object means
            try:
                detail = json.loads(e.body or "{}").get("message") or e.reason
            except ValueError:
                detail = (e.body or e.reason or "")[:500]
            hint = (f"; is the {self._gvp()[2]} CRD installed (operator '{self.profile.operator or 'hyperpod'}')?"
                    if e.status == 404 else "")
            raise HyperPodLabError(f"the Kubernetes API of cluster '{self.profile.name}' answered {e.status} to "
                                   f"{what}: {detail}{hint}") from None
        except Urllib3Error as e:
            raise ClusterUnreachable(f"the Kubernetes API of cluster '{self.profile.name}' "
                                     f"({self.api.configuration.host}) did not answer {what}: {e}") from None

    @property
    def namespace(self) -> str:
        return self.profile.namespace or km.DEFAULT_NAMESPACE

    # -- paths -------------------------------------------------------------------------------
    def job_dir(self, job_id: str) -> str:
        """The job's local directory (events of the ``operator`` writer, spec, script copy)."""
        if self.profile.shared_root:
            return posixpath.join(self.profile.shared_root, JOBS_SUBDIR, job_id)
        return os.path.join(data_dir(), "eks", self.profile.name, job_id)

    @staticmethod
    def _split(rec: JobRecord) -> tuple[str, str]:
        ns, _, name = rec.native_id.partition("/")
        return ns, name

    # -- Scheduler ---------------------------------------------------------------------------
    def manifests(self, spec: JobSpec, job_id: str, script_bytes: bytes | None = None) -> list[dict[str, Any]]:
        """The custom resource, and (with ``script_bytes``) its ConfigMap. Raises ConfigError."""
        out = [km.render_job(spec, job_id, self.profile)]
        if script_bytes is not None:
            out.insert(0, km.render_job_configmap(spec, job_id, self.profile, script_bytes))
        return out

    def render(self, spec, job_id):
        try:
            with open(os.path.expanduser(spec.script), "rb") as f:
                script = f.read()
        except OSError:
            script = b""
        head = (f"# Rendered by hyperpod-lab for job {job_id} (cluster '{self.profile.name}', "
                f"namespace {self.namespace}).\n# submit with: kubectl apply -f - (the ConfigMap first)\n")
        return head + km.to_yaml(*self.manifests(spec, job_id, script))

    def submit(self, spec, job_id, script_bytes):
        cm, job = self.manifests(spec, job_id, script_bytes)
        self.stage(spec, job_id, script_bytes)
        g, v, plural = self._gvp()
        ns = self.namespace
        self._call("creating the job's ConfigMap", self._core.create_namespaced_config_map, ns, cm)
        try:
            created = self._call(f"creating the {job['kind']}", self._custom.create_namespaced_custom_object,
                                 g, v, ns, plural, job)
        except Exception:
            self._delete_configmap(ns, cm["metadata"]["name"])
            raise
        uid = (created or {}).get("metadata", {}).get("uid")
        if uid:  # garbage-collect the ConfigMap with the job
            owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"], "uid": uid}
            try:
                self._core.patch_namespaced_config_map(cm["metadata"]["name"], ns,
                                                       {"metadata": {"ownerReferences": [owner]}})
            except Exception:
                pass  # cancel deletes it explicitly anyway
        return f"{ns}/{job['metadata']['name']}"

    def _delete_configmap(self, ns: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.delete_namespaced_config_map(name, ns)
        except ApiException as e:
            if e.status != 404:
                raise

    def get(self, rec: JobRecord) -> dict[str, Any] | None:
        """The job's custom resource (as a dict), or None if it no longer exists."""
        from kubernetes.client.exceptions import ApiException

        ns, name = self._split(rec)
        g, v, plural = self._gvp()
        try:
            return self._call("reading the job", self._custom.get_namespaced_custom_object, g, v, ns, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """All hyperpod-lab jobs in a namespace (one list call)."""
        g, v, plural = self._gvp()
        res = self._call("listing jobs", self._custom.list_namespaced_custom_object, g, v, namespace or self.namespace,
                         plural, label_selector="app.kubernetes.io/managed-by=hyperpod-lab")
        return list(res.get("items") or [])

    def poll(self, records):
        by_ns: dict[str, list[JobRecord]] = {}
        for rec in records:
            by_ns.setdefault(self._split(rec)[0], []).append(rec)
        out = {}
        for ns, recs in by_ns.items():
            items = {o["metadata"]["name"]: o for o in self.list(ns)}
            for rec in recs:
                obj = items.get(self._split(rec)[1])
                cancelled = self.remote.exists(posixpath.join(rec.job_dir, CANCELLED_MARKER))
                self.record_events(rec, obj, cancelled)
                out[rec.job_id] = job_status(obj, cancelled)
        return out

    def record_events(self, rec: JobRecord, obj: dict[str, Any] | None, cancelled: bool = False) -> list[Event]:
        """Append the events implied by ``obj``'s status since the last call to the job's
        ``operator`` event file; return them. The diff state lives in ``<job_dir>/operator-state.json``."""
        path = posixpath.join(rec.job_dir, STATE_FILE)
        try:
            prev = json.loads(self.remote.read_from(path))
        except (FileNotFoundError, ValueError):
            prev = {}
        procs = int((rec.spec or {}).get("procs_per_node") or 1)
        events, state = status_events(prev, obj, procs, time.time(), cancelled)
        written = []
        if events:
            writer = EventWriter(rec.job_dir, OPERATOR_WRITER, rec.job_id)
            written = [writer.emit(kind, **data) for kind, data in events]
        if state != prev:
            self.remote.write_bytes(path, json.dumps(state).encode())  # atomic (temporary file, rename)
        return written

    def watch(self, rec: JobRecord, timeout_s: float = 30.0) -> Iterator[Event]:
        """Follow the job's resource with a Kubernetes watch and yield the operator events as
        they are written; ends after ``timeout_s`` seconds or when the job is terminal."""
        from kubernetes import watch as kwatch

        ns, name = self._split(rec)
        g, v, plural = self._gvp()
        w = kwatch.Watch()
        for item in w.stream(self._custom.list_namespaced_custom_object, g, v, ns, plural,
                             field_selector=f"metadata.name={name}", timeout_seconds=max(1, int(timeout_s))):
            obj = item["object"] if item["type"] != "DELETED" else None
            cancelled = self.remote.exists(posixpath.join(rec.job_dir, CANCELLED_MARKER))
            for ev in self.record_events(rec, obj, cancelled):
                yield ev
            if job_status(obj, cancelled)[0].is_terminal():
                w.stop()
                return

    def cancel(self, rec):
        from kubernetes import client as kclient
        from kubernetes.client.exceptions import ApiException

        ns, name = self._split(rec)
        g, v, plural = self._gvp()
        self.remote.write_bytes(posixpath.join(rec.job_dir, CANCELLED_MARKER), b"")
        try:
            self._call("deleting the job", self._custom.delete_namespaced_custom_object, g, v, ns, plural, name,
                       body=kclient.V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as e:
            if e.status != 404:
                raise
        self._delete_configmap(ns, km.configmap_name(rec.job_id))

    # -- pods, logs, faults ------------------------------------------------------------------
    def pods(self, rec: JobRecord) -> list[Any]:
        """The job's pods ordered by node rank (pod name's trailing index; Kubeflow: Master first)."""
        ns, name = self._split(rec)
        res = self._call("listing the job's pods", self._core.list_namespaced_pod, ns,
                         label_selector=f"{km.JOB_ID_LABEL}={name}")

        def order(p):
            labels = p.metadata.labels or {}
            rtype = labels.get("training.kubeflow.org/replica-type", "")
            idx = labels.get("training.kubeflow.org/replica-index")
            if idx is None:
                tail = p.metadata.name.rsplit("-", 1)[-1]
                idx = tail if tail.isdigit() else "0"
            return (0 if rtype.lower() in ("", "master") else 1, int(idx))

        return sorted(res.items, key=order)

    def _pod_of_rank(self, rec: JobRecord, rank: int):
        procs = int((rec.spec or {}).get("procs_per_node") or 1)
        pods = self.pods(rec)
        node_rank = int(rank) // procs
        if not 0 <= node_rank < len(pods):
            raise JobStateError(f"rank {rank} of job {rec.job_id} has no pod (the job has {len(pods)} pods of "
                                f"{procs} ranks each); wait for the 'started' event")
        return pods[node_rank]

    def logs(self, rec, rank=None):
        """One rank's output (the log of its pod, which holds every local rank's lines), or every
        pod's log with a header line per pod."""
        ns, _ = self._split(rec)
        pods = [self._pod_of_rank(rec, rank)] if rank is not None else self.pods(rec)
        parts = []
        for p in pods:
            text = self._call("reading a pod log", self._core.read_namespaced_pod_log, p.metadata.name, ns)
            parts.append(text if rank is not None else f"==> pod {p.metadata.name} <==\n{text}")
        return "".join(parts) if rank is not None else "\n".join(parts)

    def inject_fault(self, rec, rank):
        """Delete the pod running ``rank`` (the operator sees a faulty pod and restarts it)."""
        ns, _ = self._split(rec)
        pod = self._pod_of_rank(rec, rank)
        self._call("deleting a pod", self._core.delete_namespaced_pod, pod.metadata.name, ns, grace_period_seconds=0)
        return {"rank": int(rank), "pod": pod.metadata.name, "node": pod.spec.node_name if pod.spec else None}

