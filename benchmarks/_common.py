"""Helpers the benchmarks share with the tests' process helpers (``tests/agents.py``).

Benchmarks never import ``tests/``; what both need lives here, and the tests import it from
here (the repository root is on ``sys.path`` in both: the benchmarks insert it, and
``tests/conftest.py`` does for pytest).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess

RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")


def arg_parser(doc: str, results_name: str, blocks: int | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: its description is the first line of ``doc`` (the module
    docstring), and ``--out`` (the JSON results) defaults to ``benchmarks/results/<results_name>``.
    ``blocks``: the benchmark alternates blocks with and without the feature; ``--blocks`` (that
    default) is how many of each kind."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, results_name), help="JSON results file")
    if blocks is not None:
        p.add_argument("--blocks", type=int, default=blocks, help="blocks of each kind (on/off alternate)")
    return p


def stop_procs(procs: list[subprocess.Popen], timeout_s: float = 20.0) -> None:
    """Stop processes we started: SIGTERM to each one still running (a launch agent then stops
    its workers), wait up to ``timeout_s`` seconds for each, SIGKILL and reap any still alive."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---- the server-load benchmark and tests/server/test_server_bounds.py ------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def track_local_job(job_dir: str, name: str, store=None, job_id: str | None = None):
    """A running job record on the local backend (native id: this process, alive while it runs;
    its directory ``job_dir`` with an ``events/``, made empty if missing), put in ``store`` (default: the
    environment's JobStore, which a jupyter-server started from this process shares); its id
    ``job_id``, default a new one from ``name``."""
    import os

    from hyperpod_lab.submit.jobs import JobRecord, JobStore, new_job_id

    os.makedirs(os.path.join(job_dir, "events"), mode=0o700, exist_ok=True)
    rec = JobRecord(job_id=job_id or new_job_id(name), name=name, cluster="local", orchestrator="local",
                    native_id=str(os.getpid()), job_dir=job_dir, spec={"args": []}, status="running")
    (store or JobStore()).put(rec)
    return rec


def write_events(job_dir: str, job_id: str, n: int, writer: str = "rank-0", pad: int = 0,
                 t0: float = 1.7e9) -> str:
    """Append ``n`` schema-v1 ``step`` events (seq 0..n-1, one a millisecond from ``t0``) to
    ``<job_dir>/events/<writer>.jsonl`` in one go, each as ``Event.to_json`` would write it
    (``pad``: a data field of that many characters, to make lines longer). Returns the path."""
    import os

    from hyperpod_lab.events import Event

    path = os.path.join(job_dir, "events", f"{writer}.jsonl")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    proto = Event(kind="step", job_id=job_id, time=4242.25, writer=writer, seq=987654321,
                  data={"loss": 0.5, "step": 123456789, **({"pad": "x" * pad} if pad else {})}).to_json()
    fmt = (proto.replace("%", "%%").replace("123456789", "%(i)d").replace("987654321", "%(i)d")
           .replace("4242.25", "%(t)r"))
    with open(path, "a") as f:
        for start in range(0, n, 50_000):
            f.write("".join(fmt % {"i": i, "t": t0 + i / 1000} + "\n" for i in range(start, min(n, start + 50_000))))
    return path


def server_rss_mb(pid: int, peak: bool = False) -> float:
    """Resident memory of process ``pid`` (``VmRSS``; ``peak``: ``VmHWM``, the high-water mark), MB."""
    key = "VmHWM:" if peak else "VmRSS:"
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} for pid {pid}")


def start_jupyter_server(root_dir: str, work_dir: str, env: dict, settings: dict | None = None,
                         token: str = "bench-token", timeout_s: float = 90.0):
    """A jupyter-server subprocess on loopback with only the hyperpod_lab extension, token
    auth, ``HyperPodLab`` settings (Watcher arguments) in its config file, and ``env`` (e.g. its
    own HYPERPOD_LAB_DATA_DIR). Returns ``(process, base url, token)``; raises RuntimeError
    with the log's tail when it does not answer ``/api/status`` within ``timeout_s``."""
    import json
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    port = free_port()
    config = os.path.join(work_dir, "jupyter_server_config.json")
    exts = {"jupyterlab": False, "jupyter_lsp": False, "jupyter_server_terminals": False,
            "notebook_shim": False, "hyperpod_lab": True}
    with open(config, "w") as f:
        json.dump({"ServerApp": {"jpserver_extensions": exts}, "HyperPodLab": settings or {}}, f)
    log_path = os.path.join(work_dir, "server.log")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--config={config}", "--no-browser", "--allow-root",
         "--ip=127.0.0.1", f"--port={port}", "--port-retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root_dir}"],
        stdout=open(log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, JUPYTER_RUNTIME_DIR=os.path.join(work_dir, "runtime"), **env))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            req = urllib.request.Request(url + "/api/status", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=5):
                return proc, url, token
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"jupyter server did not start: {open(log_path).read()[-3000:]}")


def write_results(path: str, data: dict, indent: int = 2, said: str = "written") -> int:
    """Write a benchmark's results as JSON to ``path`` (its folder made as needed) and say where:
    prints ``<said> <path>``. Returns 0, the exit status of a benchmark that got this far, so a
    ``main`` ends with ``return write_results(...)``."""
    import json
    import os

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=indent)
    print(f"{said} {path}")
    return 0
