"""A FAKE Kubernetes API server for the EKS backend's tests — not Kubernetes.

No real API server can be installed on these machines (no kube-apiserver, k3s, kind or envtest
in the reachable registries), so this serves, over real HTTP on loopback, only the paths the
EKS backend uses, with Kubernetes' JSON shapes, and plays a HyperPod training operator whose
moves the test drives:

* custom resources: create (POST), get, list (``labelSelector`` / ``fieldSelector`` on
  ``metadata.name``), watch (``?watch=true``: newline-delimited ``{"type","object"}``),
  delete, ``/status`` get and merge-patch;
* ConfigMaps: create, get, merge-patch, delete; pods: list (``labelSelector``), delete,
  ``/log``.

The operator (:class:`FakeOperator`): ``start(name)`` creates one pod per replica and sets the
``Running`` condition; ``fail_pod(name, index)`` (also triggered when a pod is deleted through
the API) records ``latestFaultyPodInstanceList``, bumps ``restartCount``, sets
``Restarting``, replaces the pod, then ``Running`` again; ``scale(name, n)`` sets
``elasticScalingStatus.targetReplicas`` and the pods; ``complete(name)`` sets ``Completed``.
Every request is recorded (method, path, query, Authorization header) for assertions.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def _now() -> str:
    """RFC 3339 with whole seconds, as the API server writes ``lastTransitionTime``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selector_match(labels: dict, selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


class FakeKube:
    """The fake API server's state and HTTP server. ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, token_prefix: str | None = None):
        self.objects: dict[tuple[str, str, str], dict] = {}  # (collection path, namespace, name)
        self.pod_logs: dict[str, str] = {}
        self.requests: list[dict] = []
        self.token_prefix = token_prefix  # when set, requests without "Bearer <prefix>..." get 401
        self.missing_crds: set[str] = set()  # plurals whose CRD is "not installed": 404
        self._rv = 0
        self._log: list[tuple[int, str, tuple, dict]] = []  # (resourceVersion, type, key, object)
        self._cv = threading.Condition()
        self.operator = FakeOperator(self)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: str, context: str = "fake", token: str = "t0ken") -> str:
        """Write a real kubeconfig file pointing at this server; return its path."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
               "users": [{"name": "u", "user": {"token": token}}],
               "contexts": [{"name": context, "context": {"cluster": "fake", "user": "u"}}]}
        with open(path, "w") as f:
            json.dump(doc, f)
        return path

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
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
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
            return h._send(200, self.pod_logs.get(name, ""), "text/plain")
        if method == "GET":
            return h._send(200, obj)
        if method == "PATCH":
            patch = h._body()
            for k, v in patch.items():
                if isinstance(v, dict) and isinstance(obj.get(k), dict):
                    obj[k].update(v)
                else:
                    obj[k] = v
            return h._send(200, self.put((coll, ns, name), obj, "MODIFIED"))
        if method == "DELETE":
            self.put((coll, ns, name), obj, "DELETED")
            if kind_list == "pods":
                self.operator.pod_deleted(ns, name)
            return h._send(200, obj)  # as the API server does: the object, now being deleted
        return h._status(405, "MethodNotAllowed", method)

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


class FakeOperator:
    """The fake's stand-in for the HyperPod training operator (see the module docstring)."""

    def __init__(self, kube: FakeKube):
        self.kube = kube
        self.auto_start = True
        self._jobs: dict[str, tuple[str, str]] = {}  # name -> (collection, namespace)
        self.lock = threading.RLock()

    def created(self, coll, ns, name):
        self._jobs[name] = (coll, ns)
        self._set(name, lambda s: self._cond(s, "Created"))
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

    @staticmethod
    def _cond(status, ctype, message=""):
        for c in status.setdefault("conditions", []):
            if c["status"] == "True":
                c["status"] = "False"
        status["conditions"].append({"type": ctype, "status": "True", "lastTransitionTime": _now(),
                                     "reason": ctype, "message": message})

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
        return self._set(name, lambda s: (self._cond(s, "Running"), s.setdefault("startTime", _now()),
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
            self._cond(s, "Restarting", f"pod {pod} failed")

        self._set(name, fault)
        if self.kube.find("api/v1/pods", ns, pod) is None:
            self._pod(name, ns, index, f"ip-10-0-1-{index + 1}")
        return self._set(name, lambda s: self._cond(s, "Running"))

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
            self._cond(s, condition, "job completed")
            s["completionTime"] = _now()

        return self._set(name, done)

    def fail(self, name, message="job failed"):
        return self._set(name, lambda s: self._cond(s, "Failed", message))
