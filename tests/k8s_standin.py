"""A STAND-IN for a Kubernetes cluster (API server, kubelet, operators) for the EKS backend's tests.

No real API server, kubelet or operator can be installed on these machines (no kube-apiserver,
k3s, kind or envtest in the reachable registries), so this module stands in for them. What is
real: HTTP on loopback with Kubernetes' JSON shapes (the real ``kubernetes`` client talks to it),
and — with :func:`start_standin` — every pod the stand-in operators create is EXECUTED as local
processes from the rendered manifest. What is not: scheduling (a least-loaded pick among the
stand-in nodes), the container image (ignored: the pod runs this machine's Python venv), EFA,
GPUs, admission, RBAC.

Usage (the API other tests rely on)::

    k = start_standin(shared_root)      # pods run; every persistentVolumeClaim -> shared_root
    with standin_in(tmp_path) as k: ... # the same, claim = tmp_path/fsx, stopped at the end
    k.url, k.kubeconfig(path)           # point a profile at it
    k.pods(ns=None) -> [pod dicts]      # the API's view of the pods
    k.node_not_ready(node)              # the node's pods fail as the taint manager evicts them
    k.node_ready(node); k.log_path(ns, pod); k.stop()

``K8sStandIn()`` without :func:`start_standin` keeps the older SCRIPTED operator
(:class:`ScriptedOperator`): pods are API objects only and the test drives the operator's moves
(``fail_pod``, ``scale``, ``complete``); tests/schedulers/test_eks_scheduler.py uses it for the
status-to-event mapping.

API server paths: custom resources create (POST), get, list (``labelSelector``,
``fieldSelector`` on ``metadata.name``), watch (``?watch=true``), delete, ``/status`` get and
merge-patch; ConfigMaps, Secrets: create, get, merge-patch, delete; pods: list, get, delete
(``gracePeriodSeconds``), ``/log`` with the PodLogOptions the real API has and we use:
``container``, ``previous``, ``tailLines``, ``limitBytes`` (k8s API reference, "read log of the
specified Pod"; ``sinceSeconds``, ``sinceTime``, ``timestamps``, ``follow`` are real but not served
here: 400 naming them; there is no ``sinceBytes`` in the API: 400 too, where the real server would
ignore it). Every request is recorded (method, path, query, Authorization header).

The kubelet stand-in (:class:`KubeletStandIn`), per pod:

* one network namespace per pod (``ip netns``), a veth ``eth0`` on a bridge that lives in the
  stand-in's own "cluster" network namespace (nothing is added to the host's network), addresses
  from 10.244.0.0/16 inside those namespaces only; ``/etc/hosts`` per pod lists every pod name
  (Kubeflow's per-pod Services have the pod's name, so they resolve too). Deviation: a replaced
  pod keeps its name's address (real pods get a new IP; their Service name stays the same);
* a new PID, UTS and mount namespace (``unshare --pid --fork --kill-child --mount-proc --uts``):
  hostname = pod name (as the kubelet sets it); the container's command+args run as PID 1 of the
  namespace, so killing it ends every process of the pod, as a container runtime does;
* volumes: ``persistentVolumeClaim`` -> ``shared_root`` bind-mounted at the mountPath (the path
  the manifest names, e.g. ``/fsx``); ``emptyDir {medium: Memory}`` -> a tmpfs (``sizeLimit``),
  as the kubelet mounts it; ``configMap`` -> its keys as files, read-only. Mount points are
  created as empty directories on the host (a runtime creates them in the image's rootfs);
* env: the container's ``env`` with ``$(VAR)`` expansion and ``$$`` -> ``$`` (kubernetes
  third_party/forked/golang/expansion/expand.go), ``valueFrom.secretKeyRef`` from the stored
  Secret, ``valueFrom.fieldRef`` for :data:`FIELD_REFS` only (others refused by name: the pod
  stays waiting with CreateContainerConfigError, as the kubelet does for a bad reference), then
  ``PATH``/``HOME`` as the image would give them (this venv's bin first) and ``HOSTNAME``;
* phase, ``containerStatuses[].restartCount``, ``state.terminated.exitCode`` (128+signal for a
  signal, as containerd reports it) come from the process; ``restartPolicy`` Always/OnFailure
  restart the container in place after a back-off (kubelet: 10 s doubling to 300 s;
  ``restart_backoff_s`` here); logs go to one file per container instance (as
  /var/log/pods/<ns>_<pod>_<uid>/<container>/<restartCount>.log);
* delete: SIGTERM to the container's PID 1, SIGKILL after ``gracePeriodSeconds`` (request) or
  ``terminationGracePeriodSeconds`` (default 30 s), then the pod is gone;
* ``node_not_ready``: the node lifecycle controller marks the node NotReady and taints it
  ``node.kubernetes.io/not-ready:NoExecute``; the taint manager evicts its pods
  (kubernetes pkg/controller/tainteviction: reason ``DeletionByTaintManager``, a
  ``DisruptionTarget`` condition) once their toleration (default 300 s, DefaultTolerationSeconds
  admission) runs out — here at once. The pods' processes are killed (the node is lost), they
  read ``Failed`` and are deleted.

The operator stand-ins:

* HyperPod (:class:`HyperPodOperatorStandIn`): pods ``<job>-<replicaSpecs.name>-<i>``; the
  operator drives the agent ``hyperpodrun`` in each pod by POSTing ``/start`` {rank, nnodes,
  faultCount, master_addr, master_port} and ``/stop`` to port 8080 and reading ``/status``
  (hyperpod-elastic-agent 1.1.3, src/hyperpod_elastic_agent/server/server.py and api_models.py;
  the operator's side is not published). The pods here run ``tests/k8s_standin_bin/hyperpodrun``,
  a STAND-IN agent that receives the same request as a file (``$HYPERPOD_STANDIN_AGENT_DIR``)
  and runs torchrun with that rendezvous. On a fault (a pod failed, deleted or evicted, or an
  agent reporting its workers failed) the operator bumps ``restartCount``, records
  ``latestFaultyPodInstanceList``, sets ``Restarting``, stops every agent, replaces faulty pods
  (``PLR``: the healthy pods keep running and their agents restart the workers; ``JLR`` after
  ``numRestartBeforeFullJobRestart`` restarts while ``maxFullJobRestarts`` allows: every pod
  replaced), starts them again, sets ``Running``; past ``jobMaxRetryCount`` the job is
  ``Failed``. All pods done -> ``Completed``. Pods not running ``hyperpodrun`` (a checkpointless
  job's Lighthouse and replica groups) just run; a faulty one is replaced alone. Pod
  restartPolicy: the template's, else Never (HyperPod documents none; the operator restarts).
* Services (ClusterIP, with a selector): the name (and ``.<ns>``, ``.<ns>.svc``,
  ``.<ns>.svc.cluster.local``) resolves in the pods' ``/etc/hosts`` to the selected pod's
  address; there is no kube-proxy, so ``port`` must equal ``targetPort``.
* Kubeflow (:class:`KubeflowOperatorStandIn`): pods ``<job>-master-0``, ``<job>-worker-<i>``
  with the training-operator's labels and env (kubeflow/training-operator
  pkg/controller.v1/pytorch/envvar.go ``setPodEnv``: PYTHONUNBUFFERED, MASTER_ADDR,
  MASTER_PORT, WORLD_SIZE (replicas), RANK (worker index + 1); PET_NNODES, PET_NPROC_PER_NODE,
  PET_NODE_RANK, PET_MASTER_ADDR/PORT (pkg/constants/constants.go, master.go); elastic:
  PET_RDZV_BACKEND, PET_RDZV_ENDPOINT, PET_RDZV_ID, PET_NNODES=min:max, PET_MAX_RESTARTS
  (elastic.go); the default port 23456); the replica's ``restartPolicy`` on the pod; a deleted
  pod is recreated; ``Succeeded`` when the Master (else every Worker) succeeded, ``Failed`` when
  a pod failed with Never or container restarts pass ``backoffLimit``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import parse_qs, urlparse

STANDIN_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_standin_bin")
AGENT_DIR_ENV = "HYPERPOD_STANDIN_AGENT_DIR"
# the downward-API fields (kubernetes docs "Downward API") the stand-in kubelet resolves: those our
# renderers use (manifest.py: POD_NAME_ENV metadata.name, POD_IP_ENV status.podIP) and the pod's
# namespace and node; any other fieldPath is refused by name
FIELD_REFS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.podIP")
LOG_PARAMS = {"container", "previous", "tailLines", "limitBytes", "pretty"}
LOG_PARAMS_NOT_SERVED = {"sinceSeconds", "sinceTime", "timestamps", "follow", "insecureSkipTLSVerifyBackend"}
DEFAULT_GRACE_S = 30  # PodSpec.terminationGracePeriodSeconds default
KUBEFLOW_DEFAULT_PORT = 23456  # training-operator pytorchv1.DefaultPort
HYPERPOD_MASTER_PORT = 23456


def _now() -> str:
    """RFC 3339 with whole seconds, as the API server writes ``lastTransitionTime``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selector_match(labels: dict, selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a command, arg or env value (kubernetes
    third_party/forked/golang/expansion/expand.go): ``$(NAME)`` -> its value when NAME is
    defined, else left as written; ``$$`` -> ``$``; any other ``$`` stays."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "$" and i + 1 < len(text):
            n = text[i + 1]
            if n == "$":
                out.append("$")
                i += 2
                continue
            if n == "(":
                j = text.find(")", i + 2)
                if j > 0:
                    name = text[i + 2:j]
                    out.append(env[name] if name in env else text[i:j + 1])
                    i = j + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


class PodConfigError(Exception):
    """A pod the stand-in kubelet cannot start (the message is what the waiting state shows)."""


# ---- the API server ------------------------------------------------------------------------
class K8sStandIn:
    """The stand-in API server's state and HTTP server. ``url`` is ``http://127.0.0.1:<port>``.

    Args:
        token_prefix: when set, requests without ``Bearer <prefix>...`` get 401.
        shared_root: with pods that run (see :func:`start_standin`): the directory every
            persistentVolumeClaim maps to.
        run_pods: execute pods (kubelet + operator stand-ins) instead of the scripted operator.
        nodes: how many stand-in nodes (run_pods only).
        restart_backoff_s: the kubelet's first container restart back-off (real: 10 s).
    """

    def __init__(self, token_prefix: str | None = None, *, shared_root: str | None = None, run_pods: bool = False,
                 nodes: int = 3, restart_backoff_s: float = 0.5):
        self.objects: dict[tuple[str, str, str], dict] = {}  # (collection path, namespace, name)
        self.pod_logs: dict[str, str] = {}  # scripted pods' logs
        self.requests: list[dict] = []
        self.token_prefix = token_prefix
        self.missing_crds: set[str] = set()  # plurals whose CRD is "not installed": 404
        self._rv = 0
        self._log: list[tuple[int, str, tuple, dict]] = []  # (resourceVersion, type, key, object)
        self._cv = threading.Condition()
        self.kubelet: KubeletStandIn | None = None
        if run_pods:
            if not shared_root:
                raise ValueError("run_pods needs shared_root (the directory the FSx claim maps to)")
            self.kubelet = KubeletStandIn(self, shared_root, nodes, restart_backoff_s)
            self.operator = OperatorStandIn(self)
        else:
            self.operator = ScriptedOperator(self)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.kubelet is not None:
            self.operator.stop()
            self.kubelet.stop()
        self.server.shutdown()
        self.server.server_close()

    stop = close

    def kubeconfig(self, path: str, context: str = "fake", token: str = "t0ken") -> str:
        """Write a real kubeconfig file pointing at this server; return its path."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
               "users": [{"name": "u", "user": {"token": token}}],
               "contexts": [{"name": context, "context": {"cluster": "fake", "user": "u"}}]}
        with open(path, "w") as f:
            json.dump(doc, f)
        return path

    # ---- helpers for tests -------------------------------------------------------------
    def pods(self, ns: str | None = None) -> list[dict]:
        """Copies of the pods the API holds (all namespaces, or ``ns``), by name."""
        with self._cv:
            return [json.loads(json.dumps(o)) for (c, n, _), o in sorted(self.objects.items())
                    if c == "api/v1/pods" and (ns is None or n == ns)]

    def node_not_ready(self, node: str) -> list[str]:
        """Node ``node`` goes NotReady: its pods are evicted (see the module docstring). Returns their names."""
        return self.kubelet.node_not_ready(node)

    def node_ready(self, node: str) -> None:
        self.kubelet.node_ready(node)

    def log_path(self, ns: str, pod: str, previous: bool = False) -> str:
        """The file holding the current (or previous) container instance's output."""
        return self.kubelet.log_file(ns, pod, previous)

    # ---- state -------------------------------------------------------------------------
    def put(self, key: tuple, obj: dict, event: str) -> dict:
        with self._cv:
            self._rv += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            if event == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            self._log.append((self._rv, event, key, json.loads(json.dumps(obj))))
            self._cv.notify_all()
        return obj

    def find(self, collection: str, ns: str, name: str) -> dict | None:
        return self.objects.get((collection, ns, name))

    def update(self, collection: str, ns: str, name: str, mutate) -> dict | None:
        """Apply ``mutate`` to a copy of the object and store it (MODIFIED); None if it is gone."""
        with self._cv:
            obj = self.find(collection, ns, name)
            if obj is None:
                return None
            obj = json.loads(json.dumps(obj))
            mutate(obj)
            return self.put((collection, ns, name), obj, "MODIFIED")

    def count(self, method: str, path_prefix: str) -> int:
        return sum(r["method"] == method and r["path"].startswith(path_prefix) for r in self.requests)

    # ---- HTTP --------------------------------------------------------------------------
    def _handler(self):
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code: int, body, ctype="application/json"):
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, msg: str):
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": msg,
                                  "reason": reason, "code": code})

            def _body(self) -> dict:
                return json.loads(self._raw or b"{}")

            def _route(self, method: str):
                self._raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))  # keep-alive: read it all
                u = urlparse(self.path)
                q = {k: v[-1] for k, v in parse_qs(u.query).items()}
                auth = self.headers.get("Authorization", "")
                fake.requests.append({"method": method, "path": u.path, "query": q, "auth": auth})
                if fake.token_prefix is not None and not auth.startswith("Bearer " + fake.token_prefix):
                    return self._status(401, "Unauthorized", "Unauthorized")
                parts = u.path.strip("/").split("/")
                # /apis/G/V/namespaces/NS/PLURAL[/NAME[/status]]  or  /api/v1/namespaces/NS/KIND[/NAME[/log]]
                base = 4 if parts[0] == "apis" else 3
                if len(parts) < base + 2 or parts[base - 1] != "namespaces":
                    return self._status(404, "NotFound", f"no route {u.path}")
                ns, coll = parts[base], "/".join(parts[:base - 1] + [parts[base + 1]])
                name = parts[base + 2] if len(parts) > base + 2 else None
                sub = parts[base + 3] if len(parts) > base + 3 else None
                return fake._serve(self, method, coll, ns, name, sub, q)

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_DELETE(self):
                self._route("DELETE")

            def do_PATCH(self):
                self._route("PATCH")

        return H

    def _serve(self, h, method, coll, ns, name, sub, q):
        kind_list = coll.rsplit("/", 1)[-1]
        if kind_list in self.missing_crds:
            return h._status(404, "NotFound", "the server could not find the requested resource")
        if method == "POST" and name is None:
            obj = h._body()
            obj.setdefault("metadata", {})
            oname = obj["metadata"].get("name")
            if self.find(coll, ns, oname):
                return h._status(409, "AlreadyExists", f"{kind_list} \"{oname}\" already exists")
            obj["metadata"].update(namespace=ns, uid=f"uid-{oname}", creationTimestamp=_now())
            if coll == "api/v1/services" and self.kubelet is not None:
                try:
                    self.kubelet.service_added(ns, obj)
                except PodConfigError as e:
                    return h._status(422, "Invalid", str(e))
            self.put((coll, ns, oname), obj, "ADDED")
            if coll.startswith("apis/") and kind_list in ("hyperpodpytorchjobs", "pytorchjobs"):
                self.operator.created(coll, ns, oname)
            return h._send(201, obj)
        if method == "GET" and name is None:
            items = [o for (c, n, _), o in sorted(self.objects.items()) if c == coll and n == ns
                     and _selector_match(o["metadata"].get("labels") or {}, q.get("labelSelector"))]
            fsel = q.get("fieldSelector", "")
            if fsel.startswith("metadata.name="):
                items = [o for o in items if o["metadata"]["name"] == fsel.split("=", 1)[1]]
            if q.get("watch") in ("true", "1", "True"):
                return self._watch(h, coll, ns, q, fsel.split("=", 1)[1] if fsel else None)
            return h._send(200, {"kind": "List", "apiVersion": "v1", "items": items,
                                 "metadata": {"resourceVersion": str(self._rv)}})
        obj = self.find(coll, ns, name)
        if obj is None:
            return h._status(404, "NotFound", f"{kind_list} \"{name}\" not found")
        if method == "GET" and sub == "log":
            return self._serve_log(h, ns, name, q)
        if method == "GET":
            return h._send(200, obj)
        if method == "PATCH":
            patch = h._body()

            def merge(o):
                for k, v in patch.items():
                    if isinstance(v, dict) and isinstance(o.get(k), dict):
                        o[k].update(v)
                    else:
                        o[k] = v

            return h._send(200, self.update(coll, ns, name, merge))
        if method == "DELETE":
            if kind_list == "pods" and self.kubelet is not None:
                body = h._body() if h._raw else {}
                grace = q.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
                return h._send(200, self.kubelet.delete_pod(ns, name, None if grace is None else int(grace)))
            self.put((coll, ns, name), obj, "DELETED")
            if kind_list == "pods":
                self.operator.pod_deleted(ns, name)
            elif self.kubelet is not None and coll.startswith("apis/"):
                self.operator.job_deleted(coll, ns, name)
            return h._send(200, obj)  # as the API server does: the object, now being deleted
        return h._status(405, "MethodNotAllowed", method)

    def _serve_log(self, h, ns, name, q):
        """``GET .../pods/NAME/log``: PodLogOptions ``tailLines`` first, then ``limitBytes``
        (the kubelet's order: it tails, then limits the stream)."""
        bad = sorted(set(q) - LOG_PARAMS)
        if bad:
            known = [b for b in bad if b in LOG_PARAMS_NOT_SERVED]
            msg = (f"the stand-in does not serve the log options {known}" if known else
                   f"{bad}: no such PodLogOptions field in the Kubernetes API (the real server ignores it)")
            return h._status(400, "BadRequest", msg)
        try:
            tail = int(q["tailLines"]) if "tailLines" in q else None
            limit = int(q["limitBytes"]) if "limitBytes" in q else None
        except ValueError:
            return h._status(400, "BadRequest", "tailLines and limitBytes must be integers")
        if (tail is not None and tail < 0) or (limit is not None and limit < 1):
            return h._status(400, "BadRequest", "tailLines must be >= 0 and limitBytes >= 1")
        previous = q.get("previous") in ("true", "1", "True")
        if self.kubelet is not None:
            try:
                path = self.kubelet.log_file(ns, name, previous)
            except KeyError as e:
                return h._status(400, "BadRequest", str(e.args[0]))
            with open(path, "rb") as f:
                data = f.read()  # the server's side (the kubelet reads its own file)
        else:
            data = self.pod_logs.get(name, "").encode()
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[len(lines) - tail:]) if tail else b""
        if limit is not None:
            data = data[:limit]
        return h._send(200, data, "text/plain")

    def _watch(self, h, coll, ns, q, name):
        since = int(q.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 30)
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(data: bytes):
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()

        sent = since
        try:
            while time.monotonic() < deadline:
                with self._cv:
                    new = [e for e in self._log if e[0] > sent and e[2][0] == coll and e[2][1] == ns
                           and (name is None or e[2][2] == name)]
                    if not new:
                        self._cv.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
                        continue
                for rv, typ, _, obj in new:
                    chunk((json.dumps({"type": typ, "object": obj}) + "\n").encode())
                    sent = rv
            chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            pass


def start_standin(shared_root: str, nodes: int = 3, token_prefix: str | None = None,
                  restart_backoff_s: float = 0.5) -> K8sStandIn:
    """A stand-in cluster whose pods run (see the module docstring). Needs root (network, PID and
    mount namespaces). Raises RuntimeError naming what is missing otherwise."""
    if os.geteuid() != 0:
        raise RuntimeError("the Kubernetes stand-in runs pods in network/mount/PID namespaces and needs root")
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"the Kubernetes stand-in needs '{tool}' (apt-get install iproute2 util-linux mount)")
    return K8sStandIn(token_prefix, shared_root=shared_root, run_pods=True, nodes=nodes,
                      restart_backoff_s=restart_backoff_s)


def wait_for(what: str, fn, timeout: float = 60.0, every: float = 0.1, diagnose=lambda why: why):
    """Poll ``fn()`` every ``every`` seconds until it returns something true, and return that;
    after ``timeout`` seconds raise AssertionError with ``diagnose(<what timed out>)`` (a test
    adds the pods' logs or the events there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(diagnose(f"timed out after {timeout} s waiting for {what}"))


@contextlib.contextmanager
def standin_in(folder) -> Iterator[K8sStandIn]:
    """A started stand-in (:func:`start_standin`) whose claim is ``<folder>/fsx`` (made here),
    stopped on exit; a test's fixture is ``with standin_in(tmp_path) as k: yield k``."""
    shared = os.path.join(str(folder), "fsx")
    os.makedirs(shared)
    k = start_standin(shared)
    try:
        yield k
    finally:
        k.stop()


# ---- the kubelet stand-in ------------------------------------------------------------------
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class _PodRun:
    """The kubelet's record of one pod."""

    def __init__(self, ns: str, name: str, node: str, ip: str, netns: str, workdir: str):
        self.ns, self.name, self.node, self.ip, self.netns, self.workdir = ns, name, node, ip, netns, workdir
        self.proc: subprocess.Popen | None = None
        self.index = 0  # the kubelet's count of pods so far: names its netns and veth
        self.restart_count = 0
        self.deleting = False
        self.done = threading.Event()
        self.lock = threading.Lock()

    def log_file(self, instance: int) -> str:
        return os.path.join(self.workdir, "logs", f"{instance}.log")

    def container_pid(self) -> int | None:
        """The host PID of the container's PID 1 (the child of ``unshare --fork``)."""
        p = self.proc
        if p is None or p.poll() is not None:
            return None
        try:
            with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                kids = f.read().split()
            return int(kids[0]) if kids else None
        except (OSError, ValueError):
            return None


class KubeletStandIn:
    """Runs pods as local processes in namespaces (see the module docstring)."""

    def __init__(self, kube: K8sStandIn, shared_root: str, nodes: int, restart_backoff_s: float):
        self.kube = kube
        self.shared_root = os.path.abspath(shared_root)
        self.backoff_s = restart_backoff_s
        self.tag = f"hplk{os.getpid()}x{id(self) % 10000}"
        self._cleanup_stale()
        self.root = tempfile.mkdtemp(prefix="k8s-standin-")
        self.cluster_ns = f"{self.tag}-net"
        # nodes: name -> {"ready": bool, "labels": {...}}; labels as HyperPod puts them on healthy nodes
        self.nodes = {f"standin-node-{i + 1}": {"ready": True, "labels": {
            "sagemaker.amazonaws.com/node-health-status": "Schedulable",
            "sagemaker.amazonaws.com/deep-health-check-status": "Passed"}} for i in range(nodes)}
        self.runs: dict[tuple[str, str], _PodRun] = {}
        self.ips: dict[str, str] = {}
        self.host_names: set[str] = set()
        self.services: dict[tuple[str, str], dict] = {}
        self.hosts = os.path.join(self.root, "hosts")
        with open(self.hosts, "w") as f:
            f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        self._n = 0
        self.lock = threading.RLock()
        _ip("netns", "add", self.cluster_ns)
        _ip("-n", self.cluster_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.cluster_ns, "link", "set", "br0", "up")

    def _cleanup_stale(self) -> None:
        """Remove namespaces an earlier stand-in of a dead test process left behind."""
        out = _ip("netns", "list", check=False).stdout
        for line in out.splitlines():
            m = re.match(r"(hplk(\d+)x\d+-\S+)", line)
            if m and not _pid_alive(int(m.group(2))):
                _ip("netns", "del", m.group(1), check=False)

    # -- scheduling and networking ------------------------------------------------------------
    def _pick_node(self, pod: dict) -> str | None:
        want = pod["spec"].get("nodeSelector") or {}
        load = {n: 0 for n in self.nodes}
        for r in self.runs.values():
            if r.node in load:
                load[r.node] += 1
        ok = [n for n, s in self.nodes.items() if s["ready"] and all(s["labels"].get(k) == v for k, v in want.items())]
        return min(ok, key=lambda n: (load[n], n)) if ok else None

    def _hosts_add(self, ip: str, name: str, ns: str) -> None:
        """Resolve ``name`` (and its ``.<ns>.svc[.cluster.local]`` forms) to ``ip`` in every pod:
        appended in place, so the pods' bind mounts of the file see it."""
        if name in self.host_names:
            return
        self.host_names.add(name)
        with open(self.hosts, "a") as f:
            f.write(f"{ip}\t{name} {name}.{ns} {name}.{ns}.svc {name}.{ns}.svc.cluster.local\n")

    def _address(self, name: str, ns: str) -> str:
        with self.lock:
            if name not in self.ips:
                k = len(self.ips)
                self.ips[name] = f"10.244.{k // 250}.{k % 250 + 2}"
                # a Kubeflow pod's Service has the pod's name; HyperPod pods get the same (a deviation)
                self._hosts_add(self.ips[name], name, ns)
            return self.ips[name]

    def service_added(self, ns: str, svc: dict) -> None:
        """A ClusterIP Service: its name resolves to the address of the pod its selector picks
        (no virtual IP, no kube-proxy: port must equal targetPort)."""
        for port in svc.get("spec", {}).get("ports") or []:
            if port.get("targetPort", port["port"]) != port["port"]:
                raise PodConfigError(f"Service {svc['metadata']['name']}: the stand-in has no kube-proxy, so "
                                     f"port {port['port']} must equal targetPort {port['targetPort']}")
        with self.lock:
            self.services[(ns, svc["metadata"]["name"])] = svc
            self._resolve_services()

    def _resolve_services(self) -> None:
        for (ns, name), svc in self.services.items():
            sel = svc.get("spec", {}).get("selector") or {}
            for (pns, pname), run in self.runs.items():
                pod = self.kube.find("api/v1/pods", pns, pname)
                labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
                if pns == ns and sel and all(labels.get(k) == v for k, v in sel.items()):
                    self._hosts_add(run.ip, name, ns)
                    break

    def _net_up(self, run: _PodRun) -> None:
        veth = f"v{run.index}"  # in the cluster namespace; the pod's end is its eth0
        _ip("netns", "add", run.netns)
        _ip("-n", self.cluster_ns, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", run.netns)
        _ip("-n", self.cluster_ns, "link", "set", veth, "master", "br0", "up")
        _ip("-n", run.netns, "addr", "add", f"{run.ip}/16", "dev", "eth0")
        _ip("-n", run.netns, "link", "set", "eth0", "up")
        _ip("-n", run.netns, "link", "set", "lo", "up")

    # -- pods -----------------------------------------------------------------------------
    def create_pod(self, ns: str, pod: dict) -> dict:
        """Admit ``pod`` (a full Pod object): bind it to a node, store it, start it in a thread."""
        name = pod["metadata"]["name"]
        pod["metadata"].update(namespace=ns, uid=f"uid-{name}-{time.monotonic_ns()}", creationTimestamp=_now())
        pod["spec"].setdefault("restartPolicy", "Always")
        with self.lock:
            node = self._pick_node(pod)
            status: dict = {"phase": "Pending", "conditions": []}
            if node is None:
                status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                             "message": "no Ready stand-in node matches the nodeSelector"})
                return self.kube.put(("api/v1/pods", ns, name), {**pod, "status": status}, "ADDED")
            pod["spec"]["nodeName"] = node
            ip = self._address(name, ns)
            self._n += 1  # under the lock: each pod its own netns, veth and folder
            workdir = os.path.join(self.root, ns, f"{name}-{self._n}")
            os.makedirs(os.path.join(workdir, "logs"))
            run = _PodRun(ns, name, node, ip, f"{self.tag}-p{self._n}", workdir)
            run.index = self._n
            self.runs[(ns, name)] = run
        status.update(hostIP=f"10.0.0.{list(self.nodes).index(node) + 1}", podIP=ip, podIPs=[{"ip": ip}])
        status["conditions"].append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
        obj = self.kube.put(("api/v1/pods", ns, name), {**pod, "status": status}, "ADDED")
        with self.lock:
            self._resolve_services()
        threading.Thread(target=self._run_pod, args=(run,), daemon=True).start()
        return obj

    def _set_status(self, run: _PodRun, mutate) -> None:
        self.kube.update("api/v1/pods", run.ns, run.name, lambda o: mutate(o.setdefault("status", {})))

    def _container_status(self, c: dict, run: _PodRun, state: dict, last: dict | None = None) -> dict:
        cs = {"name": c["name"], "image": c.get("image", ""), "imageID": "", "restartCount": run.restart_count,
              "state": state, "ready": "running" in state, "started": "running" in state}
        if run.proc is not None:
            cs["containerID"] = f"standin://{run.name}/{run.restart_count}"
        if last:
            cs["lastState"] = last
        return cs

    def _run_pod(self, run: _PodRun) -> None:
        pod = self.kube.find("api/v1/pods", run.ns, run.name)
        c = pod["spec"]["containers"][0]
        try:
            self._net_up(run)
            plan = self._plan(pod, c, run)
        except (PodConfigError, subprocess.CalledProcessError) as e:
            msg = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
            self._set_status(run, lambda s: s.update(containerStatuses=[self._container_status(
                c, run, {"waiting": {"reason": "CreateContainerConfigError", "message": msg}})]))
            run.done.set()
            return
        policy = pod["spec"].get("restartPolicy", "Always")
        backoff, last = self.backoff_s, None
        while True:
            with run.lock:
                if run.deleting:
                    break
                started = _now()
                log = open(run.log_file(run.restart_count), "ab")
                plan_path = os.path.join(run.workdir, "plan.json")
                with open(plan_path, "w") as f:
                    json.dump(plan, f)
                run.proc = subprocess.Popen(
                    ["ip", "netns", "exec", run.netns, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                     "--uts", sys.executable, os.path.abspath(__file__), "--pod-init", plan_path],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                log.close()
            self._set_status(run, lambda s: s.update(
                phase="Running", startTime=s.get("startTime", started),
                containerStatuses=[self._container_status(c, run, {"running": {"startedAt": started}}, last)]))
            rc = run.proc.wait()
            code = 128 - rc if rc < 0 else rc  # a signal: 128 + its number, as containerd reports it
            term = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                   "startedAt": started, "finishedAt": _now()}}
            if run.deleting:
                self._set_status(run, lambda s: s.update(containerStatuses=[self._container_status(c, run, term)]))
                break
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                last = term
                self._set_status(run, lambda s: s.update(containerStatuses=[self._container_status(
                    c, run, {"waiting": {"reason": "CrashLoopBackOff"}}, last)]))
                time.sleep(backoff)
                backoff = min(backoff * 2, 300.0)
                run.restart_count += 1
                continue
            self._set_status(run, lambda s: s.update(
                phase="Succeeded" if code == 0 else "Failed",
                containerStatuses=[self._container_status(c, run, term, last)]))
            break
        run.done.set()
        self.kube.operator.pod_changed(run.ns, run.name)

    def _env(self, pod: dict, c: dict) -> dict[str, str]:
        meta = pod["metadata"]
        env: dict[str, str] = {"PATH": os.pathsep.join([STANDIN_BIN, os.path.dirname(sys.executable),
                                                        "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                                        "/usr/bin", "/sbin", "/bin"]),
                               "HOME": "/root", "HOSTNAME": meta["name"]}
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "spec.nodeName": pod["spec"].get("nodeName", ""), "status.podIP": pod["status"].get("podIP", "")}
        for e in c.get("env") or []:
            if "value" in e or "valueFrom" not in e:
                env[e["name"]] = expand(e.get("value", ""), env)
                continue
            src = e["valueFrom"]
            if "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                secret = self.kube.find("api/v1/secrets", meta["namespace"], ref["name"])
                if secret is None:
                    raise PodConfigError(f'secret "{ref["name"]}" not found')
                if ref["key"] not in (secret.get("data") or {}):
                    raise PodConfigError(f'couldn\'t find key {ref["key"]} in Secret {meta["namespace"]}/{ref["name"]}')
                env[e["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                if path not in fields:
                    raise PodConfigError(f"env {e['name']}: fieldRef {path!r} is not served by the kubelet stand-in "
                                         f"(it resolves {', '.join(FIELD_REFS)})")
                env[e["name"]] = fields[path]
            else:
                raise PodConfigError(f"env {e['name']}: valueFrom {sorted(src)} is not served by the kubelet stand-in")
        return env

    def _plan(self, pod: dict, c: dict, run: _PodRun) -> dict:
        """What the pod's init (``--pod-init``) does: mounts, hostname, argv, env, working dir."""
        if not c.get("command"):
            raise PodConfigError(f"container {c['name']}: no command (the stand-in ignores the image "
                                 f"{c.get('image')!r}, so it has no entrypoint)")
        env = self._env(pod, c)
        argv = [expand(a, env) for a in list(c["command"]) + list(c.get("args") or [])]
        vols = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        # the kubelet's ClusterFirst resolv.conf (search <ns>.svc.cluster.local ...); no cluster DNS here:
        # the nameserver is the pod's own loopback, where nothing listens, so a name /etc/hosts lacks
        # fails at once instead of waiting for the host's resolver, unreachable from the pod
        resolv = os.path.join(run.workdir, "resolv.conf")
        with open(resolv, "w") as f:
            f.write(f"search {run.ns}.svc.cluster.local svc.cluster.local cluster.local\n"
                    "nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n")
        mounts = [{"kind": "bind", "src": self.hosts, "dst": "/etc/hosts", "ro": True},
                  {"kind": "bind", "src": resolv, "dst": "/etc/resolv.conf", "ro": True}]
        for vm in c.get("volumeMounts") or []:
            v = vols.get(vm["name"])
            if v is None:
                raise PodConfigError(f"volumeMount {vm['name']!r}: no such volume in the pod")
            if "persistentVolumeClaim" in v:
                mounts.append({"kind": "bind", "src": self.shared_root, "dst": vm["mountPath"],
                               "ro": bool(vm.get("readOnly"))})
            elif "emptyDir" in v:
                ed = v["emptyDir"] or {}
                if ed.get("medium") == "Memory":
                    size = str(ed.get("sizeLimit") or "")
                    mounts.append({"kind": "tmpfs", "dst": vm["mountPath"], "size": size})
                else:
                    d = os.path.join(run.workdir, "volumes", vm["name"])
                    os.makedirs(d, exist_ok=True)
                    mounts.append({"kind": "bind", "src": d, "dst": vm["mountPath"], "ro": False})
            elif "configMap" in v:
                cm = self.kube.find("api/v1/configmaps", run.ns, v["configMap"]["name"])
                if cm is None:
                    raise PodConfigError(f'configmap "{v["configMap"]["name"]}" not found')
                d = os.path.join(run.workdir, "volumes", vm["name"])
                os.makedirs(d, exist_ok=True)
                for k, text in (cm.get("data") or {}).items():
                    with open(os.path.join(d, k), "w") as f:
                        f.write(text)
                mounts.append({"kind": "bind", "src": d, "dst": vm["mountPath"], "ro": True})
            else:
                raise PodConfigError(f"volume {vm['name']!r}: {sorted(set(v) - {'name'})} is not served by the "
                                     "kubelet stand-in (it maps persistentVolumeClaim, emptyDir and configMap)")
        return {"hostname": pod["metadata"]["name"], "mounts": mounts, "argv": argv, "env": env,
                "cwd": c.get("workingDir") or "/"}

    def log_file(self, ns: str, name: str, previous: bool = False) -> str:
        run = self.runs.get((ns, name))
        if run is None:
            raise KeyError(f'container "{name}" in pod "{name}" is waiting to start: ContainerCreating')
        n = run.restart_count - 1 if previous else run.restart_count
        if n < 0 or not os.path.exists(run.log_file(n)):
            raise KeyError(f'previous terminated container in pod "{name}" not found' if previous else
                           f'container in pod "{name}" is waiting to start')
        return run.log_file(n)

    def _kill(self, run: _PodRun, grace: float) -> None:
        """SIGTERM to the container's PID 1, SIGKILL (the whole PID namespace) after ``grace`` s."""
        with run.lock:
            run.deleting = True
            proc = run.proc
        if proc is None or proc.poll() is not None:
            return
        pid = run.container_pid()
        if grace > 0 and pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)  # PID 1 of the namespace: the kernel kills the rest
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()

    def _teardown(self, run: _PodRun) -> None:
        run.done.wait(timeout=30)
        _ip("netns", "del", run.netns, check=False)

    def delete_pod(self, ns: str, name: str, grace: int | None) -> dict | None:
        """The API's DELETE: mark ``deletionTimestamp``, then (in a thread) stop the container
        and remove the pod. Returns the pod as the API server does (being deleted)."""
        obj = self.kube.find("api/v1/pods", ns, name)
        if obj is None:
            return None  # already gone
        if obj["metadata"].get("deletionTimestamp"):
            return obj  # already being deleted
        if grace is None:
            grace = int(obj["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
        obj = self.kube.update("api/v1/pods", ns, name, lambda o: o["metadata"].update(
            deletionTimestamp=_now(), deletionGracePeriodSeconds=grace)) or obj

        def finish():
            run = self.runs.get((ns, name))
            if run is not None:
                self._kill(run, grace)
                self._teardown(run)
            cur = self.kube.find("api/v1/pods", ns, name)
            if cur is not None and cur["metadata"]["uid"] == obj["metadata"]["uid"]:
                with self.lock:
                    if self.runs.get((ns, name)) is run:
                        self.runs.pop((ns, name), None)
                self.kube.put(("api/v1/pods", ns, name), cur, "DELETED")
                self.kube.operator.pod_deleted(ns, name)

        threading.Thread(target=finish, daemon=True).start()
        return obj

    def wait_gone(self, ns: str, name: str, uid: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cur = self.kube.find("api/v1/pods", ns, name)
            if cur is None or cur["metadata"]["uid"] != uid:
                return
            time.sleep(0.05)
        raise TimeoutError(f"pod {ns}/{name} was not deleted within {timeout} s")

    def node_not_ready(self, node: str) -> list[str]:
        if node not in self.nodes:
            raise KeyError(f"no stand-in node {node!r}; nodes: {sorted(self.nodes)}")
        self.nodes[node]["ready"] = False
        self.nodes[node]["labels"]["sagemaker.amazonaws.com/node-health-status"] = "UnschedulablePendingReplacement"
        victims = [r for r in list(self.runs.values()) if r.node == node]
        for run in victims:
            self._kill(run, 0)  # the node is lost: its processes die with it
            run.done.wait(timeout=30)

            def evicted(s):
                s["phase"] = "Failed"
                s["reason"] = "NodeLost"
                s.setdefault("conditions", []).append(
                    {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                     "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": _now()})

            self._set_status(run, evicted)
            obj = self.kube.find("api/v1/pods", run.ns, run.name)
            if obj is not None:
                self.delete_pod(run.ns, run.name, 0)
        return [r.name for r in victims]

    def node_ready(self, node: str) -> None:
        self.nodes[node]["ready"] = True
        self.nodes[node]["labels"]["sagemaker.amazonaws.com/node-health-status"] = "Schedulable"

    def stop(self) -> None:
        for run in list(self.runs.values()):
            self._kill(run, 0)
        for run in list(self.runs.values()):
            self._teardown(run)
        for line in _ip("netns", "list", check=False).stdout.splitlines():  # pods still being deleted too
            if line.startswith(self.tag + "-"):
                _ip("netns", "del", line.split()[0], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _pod_init(plan_path: str) -> None:
    """PID 1 of a pod (``--pod-init plan.json``): hostname, mounts, then exec the container's
    command. Failures exit 128, as runc's do."""
    with open(plan_path) as f:
        plan = json.load(f)
    try:
        import socket

        socket.sethostname(plan["hostname"])
        for m in plan["mounts"]:
            dst = m["dst"]
            if m["kind"] == "bind" and os.path.isfile(m["src"]):
                if not os.path.exists(dst):
                    open(dst, "a").close()
            else:
                os.makedirs(dst, exist_ok=True)
            if m["kind"] == "tmpfs":
                opts = "size=" + m["size"].replace("Gi", "g").replace("Mi", "m") if m["size"] else "mode=1777"
                subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", dst], check=True)
            else:
                subprocess.run(["mount", "--bind", m["src"], dst], check=True)
                if m["ro"]:
                    subprocess.run(["mount", "-o", "remount,bind,ro", dst], check=True)
        os.chdir(plan["cwd"])
        os.execvpe(plan["argv"][0], plan["argv"], plan["env"])
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"k8s stand-in: cannot start the container: {e}", file=sys.stderr, flush=True)
        os._exit(128)


# ---- the operator stand-ins ----------------------------------------------------------------
def _cond(status: dict, ctype: str, message: str = "") -> None:
    for c in status.setdefault("conditions", []):
        if c["status"] == "True":
            c["status"] = "False"
    status["conditions"].append({"type": ctype, "status": "True", "lastTransitionTime": _now(),
                                 "reason": ctype, "message": message})


class OperatorStandIn:
    """Dispatches a job to the HyperPod or Kubeflow operator stand-in (one thread per job)."""

    def __init__(self, kube: K8sStandIn):
        self.kube = kube
        self.jobs: dict[tuple[str, str], _JobLoop] = {}

    def created(self, coll, ns, name):
        cls = HyperPodOperatorStandIn if coll.endswith("hyperpodpytorchjobs") else KubeflowOperatorStandIn
        loop = cls(self.kube, coll, ns, name)
        self.jobs[(ns, name)] = loop
        loop.start()

    def _owner(self, ns, pod):
        for (jns, _), loop in self.jobs.items():
            if jns == ns and pod in loop.pod_names():
                return loop
        return None

    def pod_changed(self, ns, pod):
        loop = self._owner(ns, pod)
        if loop:
            loop.kick()

    pod_deleted = pod_changed

    def job_deleted(self, coll, ns, name):
        loop = self.jobs.pop((ns, name), None)
        if loop:
            loop.halt(delete_pods=True)

    def stop(self):
        for loop in list(self.jobs.values()):
            loop.halt(delete_pods=False)


class _JobLoop(threading.Thread):
    """One job's reconcile loop (0.1 s ticks, or at once on a pod change)."""

    def __init__(self, kube: K8sStandIn, coll: str, ns: str, name: str):
        super().__init__(daemon=True)
        self.kube, self.coll, self.ns, self.name = kube, coll, ns, name
        self.kubelet = kube.kubelet
        self._wake = threading.Event()
        self._halt = False
        self.finished = False
        self.replacing: set[str] = set()  # pods this operator deleted to replace them

    def job(self) -> dict | None:
        return self.kube.find(self.coll, self.ns, self.name)

    def set_status(self, mutate) -> None:
        self.kube.update(self.coll, self.ns, self.name, lambda o: mutate(o.setdefault("status", {})))

    def pod(self, name) -> dict | None:
        return self.kube.find("api/v1/pods", self.ns, name)

    def kick(self):
        self._wake.set()

    def halt(self, delete_pods: bool):
        self._halt = True
        self._wake.set()
        if delete_pods:
            for p in self.pod_names():
                if self.pod(p) is not None:
                    self.kubelet.delete_pod(self.ns, p, 0)

    def run(self):
        self.set_status(lambda s: _cond(s, "Created"))
        while not self._halt and not self.finished:
            try:
                self.reconcile()
            except Exception as e:  # a stand-in bug must show in the test's output, not die silently
                print(f"k8s stand-in operator ({self.name}): {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            self._wake.wait(0.1)
            self._wake.clear()

    def make_pod(self, name: str, template: dict, labels: dict, env: list[dict], restart: str) -> None:
        pod = json.loads(json.dumps(template))
        meta = pod.setdefault("metadata", {})
        meta["name"] = name
        meta.setdefault("labels", {}).update(labels)
        job = self.job()
        meta["ownerReferences"] = [{"apiVersion": job["apiVersion"], "kind": job["kind"], "name": self.name,
                                    "uid": job["metadata"]["uid"], "controller": True}]
        c = pod["spec"]["containers"][0]
        c["env"] = list(c.get("env") or []) + env
        pod["spec"]["restartPolicy"] = restart
        pod.update(apiVersion="v1", kind="Pod")
        self.kubelet.create_pod(self.ns, pod)

    def delete_and_wait(self, names) -> None:
        self.replacing.update(names)
        objs = [(n, self.pod(n)) for n in names]
        for n, o in objs:
            if o is not None:
                self.kubelet.delete_pod(self.ns, n, 0)
        for n, o in objs:
            if o is not None:
                self.kubelet.wait_gone(self.ns, n, o["metadata"]["uid"])

    def finish(self, condition: str, message: str, clean: bool) -> None:
        def done(s):
            _cond(s, condition, message)
            s["completionTime"] = _now()

        self.set_status(done)
        self.finished = True
        if clean:  # runPolicy.cleanPodPolicy All: the pods go when the job ends
            self.delete_and_wait(self.pod_names())


class HyperPodOperatorStandIn(_JobLoop):
    """The HyperPod training operator's stand-in (see the module docstring). Pods whose command is
    ``hyperpodrun`` are driven through their agent (start/stop generations); other pods (a
    checkpointless job's Lighthouse and replica groups) just run, and a faulty one is replaced alone."""

    def __init__(self, *a):
        super().__init__(*a)
        spec = self.job()["spec"]
        self.specs = [(rs, int(rs["replicas"])) for rs in spec["replicaSpecs"]]
        rp = spec.get("runPolicy") or {}
        self.max_retries = int(rp.get("jobMaxRetryCount") or 0)
        pol = rp.get("restartPolicy") or {}
        self.plr_limit = int(pol.get("numRestartBeforeFullJobRestart") or 0)
        self.max_full = int(pol.get("maxFullJobRestarts") if pol.get("maxFullJobRestarts") is not None else 1)
        self.full_restarts = 0
        self.clean = rp.get("cleanPodPolicy", "All") == "All"
        self.procs = int(spec.get("nprocPerNode") or 1) if str(spec.get("nprocPerNode", "1")).isdigit() else 1
        self.gen = 0  # the agents' start generation (faultCount)
        self.started_gen = -1
        self.running = False
        self.restarts = 0
        self.agent_root = os.path.join(self.kubelet.root, "agents", self.ns, self.name)

    def layout(self) -> list[tuple[str, dict, int, bool]]:
        """(pod name, replica spec, index, runs hyperpodrun) for every pod of the job."""
        out = []
        for rs, n in self.specs:
            cmd = (rs["template"]["spec"]["containers"][0].get("command") or [""])[0]
            out += [(f"{self.name}-{rs['name']}-{i}", rs, i, os.path.basename(cmd) == "hyperpodrun") for i in range(n)]
        return out

    def pod_names(self):
        return [p for p, *_ in self.layout()]

    def agent_pods(self):
        return [p for p, _, _, agent in self.layout() if agent]

    def ranks_of(self, pod: str) -> list[str]:
        """Global ranks of a pod: agent pods in order, ``nprocPerNode`` each; for other pods, their
        replica index among the pods of role other than the Lighthouse."""
        agents = self.agent_pods()
        if pod in agents:
            i = agents.index(pod)
            return [str(i * self.procs + r) for r in range(self.procs)]
        for p, rs, i, _ in self.layout():
            role = (rs["template"].get("metadata", {}).get("labels") or {}).get("hyperpod-lab.io/role")
            if p == pod and role != "lighthouse":
                return [str(i * self.procs + r) for r in range(self.procs)]
        return []

    def agent_dir(self, pod: str) -> str:
        return os.path.join(self.agent_root, pod)

    def agent_status(self, pod: str) -> dict:
        try:
            with open(os.path.join(self.agent_dir(pod), "status.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _write(self, pod: str, what: str, doc: dict) -> None:
        d = self.agent_dir(pod)
        tmp = os.path.join(d, f".{what}.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, os.path.join(d, f"{what}.json"))

    def ensure_pods(self) -> None:
        for p, rs, i, agent in self.layout():
            if self.pod(p) is None:
                env = []
                if agent:
                    d = self.agent_dir(p)
                    shutil.rmtree(d, ignore_errors=True)
                    os.makedirs(d)
                    env = [{"name": AGENT_DIR_ENV, "value": d}]
                # HyperPod documents no pod restartPolicy: the template's, else Never (the operator restarts)
                self.make_pod(p, rs["template"], {"sagemaker.amazonaws.com/replica-index": str(i)}, env,
                              rs["template"]["spec"].get("restartPolicy", "Never"))
                self.replacing.discard(p)

    def reconcile(self):
        if self.job() is None:
            return self.halt(True)
        names, agents_ = self.pod_names(), self.agent_pods()
        pods = {p: self.pod(p) for p in names}
        phases = {p: (o or {}).get("status", {}).get("phase") for p, o in pods.items()}
        agents = {p: self.agent_status(p) for p in agents_}
        if self.started_gen == self.gen:
            if all(a.get("state") == "succeeded" and a.get("generation") == self.gen for a in agents.values()) \
                    and all(ph == "Succeeded" for ph in phases.values()):
                return self.finish("Completed", "job completed", self.clean)
            faulty = [p for p in names if (pods[p] is None and p not in self.replacing) or phases[p] == "Failed"
                      or (pods[p] or {}).get("metadata", {}).get("deletionTimestamp")
                      or (p in agents and agents[p].get("state") == "faulted" and agents[p].get("generation") == self.gen)]
            if faulty:
                return self.fault(faulty, pods)
        self.ensure_pods()
        pods = {p: self.pod(p) for p in names}
        up = all(o and o["status"].get("phase") in ("Running", "Succeeded") and not o["metadata"].get("deletionTimestamp")
                 for o in pods.values())
        if self.started_gen < self.gen and up and all(self.agent_status(p).get("state") == "ready" for p in agents_):
            master = pods[agents_[0]]["status"]["podIP"] if agents_ else ""
            for i, p in enumerate(agents_):  # the agent's /start request body (api_models.StartRequest)
                self._write(p, "start", {"generation": self.gen, "rank": i, "nnodes": len(agents_),
                                         "faultCount": self.gen, "master_addr": master,
                                         "master_port": HYPERPOD_MASTER_PORT, "spare": False})
            self.started_gen = self.gen
        if not self.running and self.started_gen == self.gen and up:
            self.running = True

            def running(s):
                _cond(s, "Running")
                s.setdefault("startTime", _now())
                s.setdefault("restartCount", 0)

            self.set_status(running)

    def fault(self, faulty: list[str], pods: dict) -> None:
        self.restarts += 1
        self.running = False
        names, agents = self.pod_names(), self.agent_pods()
        jlr = self.restarts > self.plr_limit and self.full_restarts < self.max_full
        if self.restarts > self.max_retries:
            self.delete_and_wait(names)
            return self.finish("Failed", f"pods {faulty} failed; jobMaxRetryCount {self.max_retries} reached",
                               clean=False)

        def record(s):
            s["restartCount"] = self.restarts
            s["latestFaultyPodInstanceList"] = {
                "restartType": "JLR" if jlr else "PLR", "faultyPodList": faulty,
                "faultyInstanceIdList": [(pods.get(p) or {}).get("spec", {}).get("nodeName", "") for p in faulty],
                "faultyRankList": [r for p in faulty for r in self.ranks_of(p)]}
            _cond(s, "Restarting", f"pods {', '.join(faulty)} faulted")

        self.set_status(record)
        if jlr:
            self.full_restarts += 1
        if jlr or any(p in agents for p in faulty):
            for p in agents:  # /stop to every agent: the workers of every agent pod restart (PLR)
                if self.pod(p) is not None:
                    self._write(p, "stop", {"generation": self.gen})
            self.gen += 1
        replace = names if jlr else [p for p in faulty if self.pod(p) is not None and (
            self.pod(p)["status"].get("phase") == "Failed" or self.pod(p)["metadata"].get("deletionTimestamp"))]
        self.delete_and_wait(replace)


class KubeflowOperatorStandIn(_JobLoop):
    """The Kubeflow training-operator's stand-in (see the module docstring)."""

    def __init__(self, *a):
        super().__init__(*a)
        spec = self.job()["spec"]
        self.specs = spec["pytorchReplicaSpecs"]
        self.elastic = spec.get("elasticPolicy")
        rp = spec.get("runPolicy") or {}
        self.backoff_limit = rp.get("backoffLimit")
        self.clean = rp.get("cleanPodPolicy", "Running") == "All"
        self.nproc = spec.get("nprocPerNode", "auto")
        self.total = sum(int(r["replicas"]) for r in self.specs.values())
        self.running_set = False

    def pods_by_type(self):
        out = []
        for rtype in ("Master", "Worker"):
            if rtype in self.specs:
                out += [(rtype, i, f"{self.name}-{rtype.lower()}-{i}") for i in range(int(self.specs[rtype]["replicas"]))]
        return out

    def pod_names(self):
        return [n for _, _, n in self.pods_by_type()]

    def env(self, rtype: str, index: int) -> list[dict]:
        env = [{"name": "PYTHONUNBUFFERED", "value": "0"}]
        port = str(KUBEFLOW_DEFAULT_PORT)
        if "Master" in self.specs:
            rank = index + 1 if rtype == "Worker" else index
            master = f"{self.name}-master-0"
            env += [{"name": "MASTER_PORT", "value": port}, {"name": "PET_MASTER_PORT", "value": port},
                    {"name": "MASTER_ADDR", "value": master}, {"name": "PET_MASTER_ADDR", "value": master},
                    {"name": "WORLD_SIZE", "value": str(self.total)}, {"name": "RANK", "value": str(rank)},
                    {"name": "PET_NODE_RANK", "value": str(rank)}]
        env.append({"name": "PET_NPROC_PER_NODE", "value": str(self.nproc)})
        if self.elastic:
            e = self.elastic
            env += [{"name": "PET_RDZV_BACKEND", "value": e.get("rdzvBackend", "c10d")},
                    {"name": "PET_RDZV_ENDPOINT", "value": f"{self.name}-worker-0:{port}"},
                    {"name": "PET_RDZV_ID", "value": self.name},
                    {"name": "PET_NNODES", "value": f"{e.get('minReplicas')}:{e.get('maxReplicas')}"},
                    {"name": "PET_MAX_RESTARTS", "value": str(e.get("maxRestarts", 0))}]
        else:
            env.append({"name": "PET_NNODES", "value": str(self.total)})
        return env

    def reconcile(self):
        if self.job() is None:
            return self.halt(True)
        phases = {}
        restarts = 0
        for rtype, i, name in self.pods_by_type():
            o = self.pod(name)
            if o is None:
                spec = self.specs[rtype]
                self.make_pod(name, spec["template"], {
                    "training.kubeflow.org/job-name": self.name, "training.kubeflow.org/operator-name":
                        "pytorchjob-controller", "training.kubeflow.org/replica-type": rtype.lower(),
                    "training.kubeflow.org/replica-index": str(i)}, self.env(rtype, i),
                    spec.get("restartPolicy", "Never"))
                o = self.pod(name)
            phases[name] = (rtype, o["status"].get("phase"), o["spec"].get("restartPolicy"))
            restarts += sum(cs.get("restartCount", 0) for cs in o["status"].get("containerStatuses") or [])
        failed = [n for n, (_, ph, pol) in phases.items() if ph == "Failed" and pol == "Never"]
        if failed:
            return self.finish("Failed", f"pods {failed} failed", self.clean)
        if self.backoff_limit is not None and restarts > int(self.backoff_limit):
            return self.finish("Failed", f"container restarts {restarts} passed backoffLimit {self.backoff_limit}",
                               self.clean)
        masters = [ph for rt, ph, _ in phases.values() if rt == "Master"]
        done = masters if masters else [ph for _, ph, _ in phases.values()]
        if done and all(ph == "Succeeded" for ph in done):
            return self.finish("Succeeded", "PyTorchJob succeeded", self.clean)
        if not self.running_set and all(ph == "Running" for _, ph, _ in phases.values()):
            self.running_set = True
            self.set_status(lambda s: (_cond(s, "Running"), s.setdefault("startTime", _now())))


# ---- the scripted operator (pods are API objects only) ----------------------------------
class ScriptedOperator:
    """The scripted operator: ``start(name)`` creates one pod object per replica and sets the
    ``Running`` condition; ``fail_pod(name, index)`` (also triggered when a pod is deleted through
    the API) records ``latestFaultyPodInstanceList``, bumps ``restartCount``, sets ``Restarting``,
    replaces the pod, then ``Running`` again; ``scale(name, n)`` sets
    ``elasticScalingStatus.targetReplicas`` and the pods; ``complete(name)`` sets ``Completed``.
    Nothing runs: the tests drive each move."""

    def __init__(self, kube: K8sStandIn):
        self.kube = kube
        self.auto_start = True
        self._jobs: dict[str, tuple[str, str]] = {}  # name -> (collection, namespace)
        self.lock = threading.RLock()

    def created(self, coll, ns, name):
        self._jobs[name] = (coll, ns)
        self._set(name, lambda s: _cond(s, "Created"))
        if self.auto_start:
            self.start(name)

    def _job(self, name) -> dict:
        coll, ns = self._jobs[name]
        return self.kube.find(coll, ns, name)

    def _set(self, name, mutate) -> dict:
        with self.lock:
            coll, ns = self._jobs[name]
            obj = json.loads(json.dumps(self._job(name)))
            mutate(obj.setdefault("status", {}))
            return self.kube.put((coll, ns, name), obj, "MODIFIED")

    _cond = staticmethod(_cond)

    def _replicas(self, name) -> int:
        spec = self._job(name)["spec"]
        if "replicaSpecs" in spec:
            return sum(r["replicas"] for r in spec["replicaSpecs"])
        return sum(r["replicas"] for r in spec["pytorchReplicaSpecs"].values())

    def _pod(self, name, ns, index, node):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{name}-pod-{index}", "namespace": ns,
                            "labels": {"hyperpod-lab.io/job-id": name}},
               "spec": {"nodeName": node, "containers": [{"name": "pytorch", "image": "img"}]},
               "status": {"phase": "Running"}}
        self.kube.pod_logs[pod["metadata"]["name"]] = f"pod {index} on {node}: step 0 loss 5.5\nstep 1 loss 5.1\n"
        self.kube.put(("api/v1/pods", ns, pod["metadata"]["name"]), pod, "ADDED")

    def start(self, name, replicas: int | None = None):
        """Pods start (one per replica) and the job is Running."""
        coll, ns = self._jobs[name]
        for i in range(replicas or self._replicas(name)):
            self._pod(name, ns, i, f"ip-10-0-0-{i + 1}")
        return self._set(name, lambda s: (_cond(s, "Running"), s.setdefault("startTime", _now()),
                                          s.setdefault("restartCount", 0)))

    def fail_pod(self, name, index: int, restart_type: str = "PLR", procs_per_node: int = 1):
        """Pod ``index`` fails: faulty-pod list, restart count + 1, Restarting, pod replaced, Running."""
        coll, ns = self._jobs[name]
        pod = f"{name}-pod-{index}"

        def fault(s):
            s["restartCount"] = int(s.get("restartCount") or 0) + 1
            s["latestFaultyPodInstanceList"] = {
                "restartType": restart_type, "faultyPodList": [pod], "faultyInstanceIdList": [f"i-0{index}"],
                "faultyRankList": [str(index * procs_per_node + r) for r in range(procs_per_node)]}
            _cond(s, "Restarting", f"pod {pod} failed")

        self._set(name, fault)
        if self.kube.find("api/v1/pods", ns, pod) is None:
            self._pod(name, ns, index, f"ip-10-0-1-{index + 1}")
        return self._set(name, lambda s: _cond(s, "Running"))

    def pod_deleted(self, ns, pod):
        for name, (_, jns) in list(self._jobs.items()):
            if jns == ns and pod.startswith(name + "-pod-") and self._job(name) is not None:
                threading.Thread(target=self.fail_pod, args=(name, int(pod.rsplit("-", 1)[1])), daemon=True).start()

    def scale(self, name, replicas: int):
        """The elastic policy scales the job to ``replicas`` nodes."""
        coll, ns = self._jobs[name]
        for i in range(replicas):
            if self.kube.find("api/v1/pods", ns, f"{name}-pod-{i}") is None:
                self._pod(name, ns, i, f"ip-10-0-2-{i + 1}")

        def sc(s):
            s["elasticScalingStatus"] = {"targetReplicas": {"workers": replicas}, "lastScalingTime": _now()}

        return self._set(name, sc)

    def complete(self, name, condition: str = "Completed"):
        """The job ends well (HyperPod: ``Completed``; Kubeflow: ``Succeeded``)."""
        def done(s):
            _cond(s, condition, "job completed")
            s["completionTime"] = _now()

        return self._set(name, done)

    def fail(self, name, message="job failed"):
        return self._set(name, lambda s: _cond(s, "Failed", message))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--pod-init":
    _pod_init(sys.argv[2])
