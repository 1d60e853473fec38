"""EKS backend: a JobSpec as a HyperPodPyTorchJob (or Kubeflow PyTorchJob) custom resource.

Talks to the Kubernetes API through the ``kubernetes`` Python client, configured by
:mod:`hyperpod_lab.schedulers.eks.auth` (a kubeconfig context, or an EKS token made with boto3;
nothing is contacted until the first API call, so ``--dry-run`` works offline). The operator's
view of the job becomes events of the writer ``operator`` in the job's local directory through
:mod:`hyperpod_lab.schedulers.eks.status`. The local job directory is the
:class:`~hyperpod_lab.jobdir.JobPaths` of the job below the profile's ``shared_root`` when it sets
one (the FSx file system mounted on the notebook host: the runtime's own events appear there too),
else ``<data dir>/eks/<cluster>/<job id>``.

The names of both helper modules that callers use (``eks_token``, ``kube_configuration``,
``job_status``, ``status_events``, ``OPERATOR_WRITER``) are importable from here too.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Iterator

from hyperpod_lab.errors import ClusterUnreachable, ConfigError, HyperPodLabError, JobStateError
from hyperpod_lab.events import OPERATOR_WRITER, Event, EventWriter
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.schedulers.base import DEFAULT_LOG_TAIL, LOG_PAGE_BYTES, LogChunk, Scheduler
from hyperpod_lab.schedulers.eks import manifest as km
from hyperpod_lab.schedulers.eks.auth import TOKEN_PREFIX, eks_token, kube_configuration
from hyperpod_lab.schedulers.eks.status import job_status, status_events
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile, data_dir
from hyperpod_lab.submit.jobs import JobRecord

__all__ = ["EksScheduler", "OPERATOR_WRITER", "TOKEN_PREFIX", "eks_token", "kube_configuration",
           "job_status", "status_events"]


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
        if km.is_kubeflow(self.profile):
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
            return JobPaths.for_job(self.profile.shared_root, job_id).folder
        return os.path.join(data_dir(), "eks", self.profile.name, job_id)

    def _cancelled(self, rec: JobRecord) -> bool:
        """Whether we cancelled the job (its resource being gone then means CANCELLED, not FAILED)."""
        return self.remote.exists(JobPaths(rec.job_dir).cancelled)

    @staticmethod
    def _split(rec: JobRecord) -> tuple[str, str]:
        ns, _, name = rec.native_id.partition("/")
        return ns, name

    # -- Scheduler ---------------------------------------------------------------------------
    def manifests(self, spec: JobSpec, job_id: str, script_bytes: bytes | None = None) -> list[dict[str, Any]]:
        """The custom resource, and (with ``script_bytes``) its ConfigMap first; then what else the
        job needs (:func:`~hyperpod_lab.schedulers.eks.manifest.extra_resources`: a checkpointless
        HyperPodPyTorchJob's Lighthouse Service). Raises ConfigError."""
        out = [km.render_job(spec, job_id, self.profile)]
        if script_bytes is not None:
            out.insert(0, km.render_job_configmap(spec, job_id, self.profile, script_bytes))
        return out + km.extra_resources(spec, job_id, self.profile)

    def render(self, spec, job_id):
        try:
            with open(os.path.expanduser(spec.script), "rb") as f:
                script = f.read()
        except OSError:
            script = b""
        head = (f"# Rendered by hyperpod-lab for job {job_id} (cluster '{self.profile.name}', "
                f"namespace {self.namespace}).\n# submit with: kubectl apply -f - (the ConfigMap first)\n")
        return head + km.to_yaml(*self.manifests(spec, job_id, script))

    def submit(self, spec, job_id, script_bytes, secrets=None):
        """The job's Secret (``spec.secret_env``, if any), ConfigMap, then its custom resource,
        then a checkpointless HyperPodPyTorchJob's Lighthouse Service; all owned by
        (garbage-collected with) the resource."""
        cm, job, *services = self.manifests(spec, job_id, script_bytes)
        secret = km.render_job_secret(spec, job_id, self.profile, secrets or {}) if spec.secret_env else None
        self.stage(spec, job_id, script_bytes)
        g, v, plural = self._gvp()
        ns = self.namespace
        if secret:
            self._call("creating the job's Secret", self._core.create_namespaced_secret, ns, secret)
        try:
            self._call("creating the job's ConfigMap", self._core.create_namespaced_config_map, ns, cm)
            try:
                created = self._call(f"creating the {job['kind']}", self._custom.create_namespaced_custom_object,
                                     g, v, ns, plural, job)
            except Exception:
                self._delete(self._core.delete_namespaced_config_map, ns, cm["metadata"]["name"])
                raise
        except Exception:
            if secret:
                self._delete(self._core.delete_namespaced_secret, ns, secret["metadata"]["name"])
            raise
        uid = (created or {}).get("metadata", {}).get("uid")
        if uid:  # garbage-collect the ConfigMap and Secret with the job
            owner = {"metadata": {"ownerReferences": [
                {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"], "uid": uid}]}}
            patches = [(self._core.patch_namespaced_config_map, cm)] + (
                [(self._core.patch_namespaced_secret, secret)] if secret else [])
            for patch, obj in patches:
                try:
                    patch(obj["metadata"]["name"], ns, owner)
                except Exception:
                    pass  # cancel deletes them explicitly anyway
        for svc in services:  # a checkpointless job's Lighthouse Service, owned by the job when it has a uid
            if uid:
                svc = {**svc, "metadata": {**svc["metadata"], **owner["metadata"]}}
            self._call("creating the job's Lighthouse Service", self._core.create_namespaced_service, ns, svc)
        return f"{ns}/{job['metadata']['name']}"

    @staticmethod
    def _delete(delete, ns: str, name: str) -> None:
        """``delete(name, ns)`` of a core API object; a missing one is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            delete(name, ns)
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
                cancelled = self._cancelled(rec)
                self.record_events(rec, obj, cancelled)
                out[rec.job_id] = job_status(obj, cancelled)
        return out

    def record_events(self, rec: JobRecord, obj: dict[str, Any] | None, cancelled: bool = False) -> list[Event]:
        """Append the events implied by ``obj``'s status since the last call to the job's
        ``operator`` event file; return them. The diff state lives in ``<job_dir>/operator-state.json``."""
        path = JobPaths(rec.job_dir).operator_state
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
            cancelled = self._cancelled(rec)
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
        self.remote.write_bytes(JobPaths(rec.job_dir).cancelled, b"")
        try:
            self._call("deleting the job", self._custom.delete_namespaced_custom_object, g, v, ns, plural, name,
                       body=kclient.V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as e:
            if e.status != 404:
                raise
        self._delete(self._core.delete_namespaced_config_map, ns, km.configmap_name(rec.job_id))
        if (rec.spec or {}).get("secret_env"):
            self._delete(self._core.delete_namespaced_secret, ns, km.secret_name(rec.job_id))
        if ((rec.spec or {}).get("resiliency") or {}).get("recovery") == km.RECOVERY_CHECKPOINTLESS \
                and not km.is_kubeflow(self.profile):
            self._delete(self._core.delete_namespaced_service, ns, km.lighthouse_service_name(rec.job_id))

    # -- pods, logs, faults ------------------------------------------------------------------
    def pods(self, rec: JobRecord) -> list[Any]:
        """The job's pods ordered by node rank (pod name's trailing index; Kubeflow: Master first);
        a checkpointless job's Lighthouse pod (no ranks) is left out."""
        ns, name = self._split(rec)
        res = self._call("listing the job's pods", self._core.list_namespaced_pod, ns,
                         label_selector=f"{km.JOB_ID_LABEL}={name}")
        items = [p for p in res.items if (p.metadata.labels or {}).get(km.ROLE_LABEL) != km.ROLE_LIGHTHOUSE]

        def order(p):
            labels = p.metadata.labels or {}
            rtype = labels.get("training.kubeflow.org/replica-type", "")
            idx = labels.get("training.kubeflow.org/replica-index")
            if idx is None:
                tail = p.metadata.name.rsplit("-", 1)[-1]
                idx = tail if tail.isdigit() else "0"
            return (0 if rtype.lower() in ("", "master") else 1, int(idx))

        return sorted(items, key=order)

    def _pod_of_rank(self, rec: JobRecord, rank: int):
        procs = int((rec.spec or {}).get("procs_per_node") or 1)
        pods = self.pods(rec)
        node_rank = int(rank) // procs
        if not 0 <= node_rank < len(pods):
            raise JobStateError(f"rank {rank} of job {rec.job_id} has no pod (the job has {len(pods)} pods of "
                                f"{procs} ranks each); wait for the 'started' event")
        return pods[node_rank]

    def logs(self, rec, rank=None, offset=None, length=None):
        """One rank's output (the log of its pod, which holds every local rank's lines), or every
        pod's log with a header line per pod; with ``offset``/``length``, that range of it
        (:meth:`log_range`). Without, the whole text, read in pages of :data:`LOG_PAGE_BYTES`
        through :meth:`log_range` until a page reaches the end."""
        if offset is not None or length is not None:
            return self.log_range(rec, rank, offset, length).text
        parts, pos = [], 0
        while True:
            chunk = self.log_range(rec, rank, pos, LOG_PAGE_BYTES)
            parts.append(chunk.raw or b"")
            if chunk.size is not None or chunk.end <= pos:
                break
            pos = chunk.end
        return b"".join(parts).decode(errors="replace")

    def log_range(self, rec, rank=None, offset=None, length=None):
        """A byte range of :meth:`logs`, read through the pod log API's ``PodLogOptions`` (Kubernetes
        API reference, "read log of the specified Pod": ``limitBytes``, ``tailLines``; it has no
        byte offset), never a pod's whole log:

        * ``offset`` given: each pod's log (in order, after its ``==> pod NAME <==`` header when
          ``rank`` is None) with ``limitBytes`` = the bytes still needed to reach ``offset + length``;
          the bytes before ``offset`` travel too (there is no offset option). ``size`` is the
          log's length when the reads reached its end (a reply shorter than asked), else None.
        * ``offset`` None (the tail of ``length`` bytes, default :data:`DEFAULT_LOG_TAIL`):
          ``tailLines`` = ``length // 80 + 1``, times 4 until the reply holds ``length`` bytes or
          fewer lines than asked (the whole log); pods from the last back when ``rank`` is None.
          ``offset``/``size`` are exact when the whole log came back; otherwise the API cannot
          tell how many bytes came before, and the chunk's ``offset`` is 0 with ``size`` None.

        Returns:
            LogChunk with ``raw`` bytes. Raises JobStateError for a rank without a pod; the
            API's errors as :meth:`_call` maps them.
        """
        ns, _ = self._split(rec)
        names = [self._pod_of_rank(rec, rank).metadata.name] if rank is not None else \
            [p.metadata.name for p in self.pods(rec)]
        heads = [b"" if rank is not None else (b"\n" if i else b"") + f"==> pod {n} <==\n".encode()
                 for i, n in enumerate(names)]
        length = DEFAULT_LOG_TAIL if length is None else max(0, int(length))
        if offset is not None:
            offset, want_end, data, whole = max(0, int(offset)), max(0, int(offset)) + length, b"", True
            for name, head in zip(names, heads):
                data += head
                if len(data) >= want_end:
                    whole = False
                    break
                body = self._read_pod_log(name, ns, limit_bytes=want_end - len(data))
                data += body
                if len(data) >= want_end:  # a full reply: the log may go on
                    whole = False
                    break
            start = min(offset, len(data))
            chunk = data[start:want_end]
            return LogChunk(chunk.decode(errors="replace"), start, start + len(chunk),
                            len(data) if whole else None, raw=chunk)
        data, whole = b"", True
        for name, head in zip(reversed(names), reversed(heads)):
            need = length - len(data)
            if need <= 0:
                whole = False
                break
            body, complete = self._tail_pod_log(name, ns, need)
            data = (head + body if complete else body) + data
            if not complete:
                whole = False
                break
        chunk = data[max(0, len(data) - length):] if length else b""
        if whole:
            return LogChunk(chunk.decode(errors="replace"), len(data) - len(chunk), len(data), len(data), raw=chunk)
        return LogChunk(chunk.decode(errors="replace"), 0, len(chunk), None, raw=chunk)

    def _read_pod_log(self, pod: str, ns: str, **options) -> bytes:
        """The pod log API's reply as bytes (``limit_bytes``, ``tail_lines``)."""
        resp = self._call("reading a pod log", self._core.read_namespaced_pod_log, pod, ns,
                          _preload_content=False, **options)
        try:
            return resp.data
        finally:
            resp.release_conn()

    def _tail_pod_log(self, pod: str, ns: str, n: int) -> tuple[bytes, bool]:
        """At most the last ``n`` bytes of a pod's log, and whether they are the whole log."""
        lines = n // 80 + 1
        while True:
            data = self._read_pod_log(pod, ns, tail_lines=lines)
            if len(data.splitlines()) < lines:
                return data[-n:] if len(data) > n else data, len(data) <= n
            if len(data) >= n:
                return data[-n:], False
            lines *= 4

    def _kill_rank(self, rec, rank):
        """``inject-fault --kind kill``: delete the pod running ``rank`` at once (grace period 0;
        the operator sees a faulty pod and restarts it). Returns ``{"rank", "pod", "node"}``."""
        ns, _ = self._split(rec)
        pod = self._pod_of_rank(rec, rank)
        self._call("deleting a pod", self._core.delete_namespaced_pod, pod.metadata.name, ns, grace_period_seconds=0)
        return {"rank": int(rank), "pod": pod.metadata.name, "node": pod.spec.node_name if pod.spec else None}

    def _fail_node(self, rec, rank):
        """``inject-fault --kind node``: the rank's pod is deleted (grace period 0), which is how a
        lost node reaches the operator; the Kubernetes node itself is left alone (cordoning or
        draining it needs cluster-admin rights and would hit other tenants' pods). Returns
        ``{"rank", "pod", "node", "how"}``."""
        info = self._kill_rank(rec, rank)
        ns, _ = self._split(rec)
        return {**info, "how": f"delete pod {ns}/{info['pod']} (grace period 0)"}

    def _write_request(self, rec, rank, kind, message, factor=None):
        """``inject-fault --kind exception|slow|hang`` (a pod's process cannot be signalled from
        here: ``hang`` is the rank stopping itself): the request file must be where the pods read
        the job directory, the profile's ``shared_root`` (FSx mounted here and in the pods).
        Raises JobStateError without one; else as :meth:`Scheduler._write_request`."""
        if not self.profile.shared_root:
            raise JobStateError(f"cluster profile {self.profile.name!r} sets no shared_root, so the job's pods cannot "
                                "read a fault request written here; set shared_root to the FSx mount, or use --kind kill")
        return super()._write_request(rec, rank, kind, message, factor)
