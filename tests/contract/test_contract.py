"""The job contract (hyperpod_lab/jobdir.py) and the one-way imports around it.

The submit side (server, client, CLI, magics, widgets, schedulers) never imports torch, not even
lazily: it runs in the Jupyter server and the kernel, where loading torch costs seconds and
hundreds of MB. The in-job runtime never imports Jupyter or the submit side. The two meet only
through the JobSpec, the events and ``hyperpod_lab.jobdir``. See docs/architecture.md.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

from hyperpod_lab import jobdir
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.spec import JobSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "hyperpod_lab")
SCRIPT = os.path.join(ROOT, "tests", "scripts", "ft_train.py")

SUBMIT_SIDE = ["hyperpod_lab", "hyperpod_lab.jobdir", "hyperpod_lab.server", "hyperpod_lab.server.handlers.base",
               "hyperpod_lab.server.watch.watcher", "hyperpod_lab.server.handlers.stream", "hyperpod_lab.submit.client",
               "hyperpod_lab.cli", "hyperpod_lab.notebook.magics", "hyperpod_lab.notebook.widgets", "hyperpod_lab.goodput",
               "hyperpod_lab.submit.discovery", "hyperpod_lab.fold.progress", "hyperpod_lab.schedulers",
               "hyperpod_lab.schedulers.slurm", "hyperpod_lab.schedulers.local", "hyperpod_lab.schedulers.eks.scheduler",
               "hyperpod_lab.schedulers.eks.manifest", "hyperpod_lab.schedulers.remote",
               "hyperpod_lab.schedulers._local_wrapper"]

# a meta-path finder that makes torch (and torchft) unimportable in this process only: the job's
# own processes, started by the local backend, import torch as usual
_NO_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "torchft"):
                raise ImportError(f"{name} is blocked: the submit side must not import torch")
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def _run_without_torch(body: str, timeout: float = 300) -> subprocess.CompletedProcess:
    code = _NO_TORCH + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.path.join(ROOT, "tests"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


def test_submit_side_imports_without_torch():
    res = _run_without_torch(f"""
        import importlib, sys
        for name in {SUBMIT_SIDE!r}:
            importlib.import_module(name)
        assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "torchft")]
        print("OK")
    """)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]


def test_every_module_outside_the_ranks_imports_without_torch():
    """Every module of node/ (but the torchrun agent, node/launch.py), fold/, submit/, server/,
    notebook/, cli/, schedulers/, goodput/ and the top level imports with torch made
    unimportable, and so do ``hyperpod_lab.runtime`` itself (lazy, PEP 562) and its shims for old
    command lines: the supervisor and each node's health check start without torch's import."""
    res = _run_without_torch("""
        import importlib, pkgutil, sys
        import hyperpod_lab
        import hyperpod_lab.runtime as rt
        shims = {"hyperpod_lab.runtime." + n for n in ("launch", "supervisor", "health", "lighthouse", "ft_local")}
        names = []
        for m in pkgutil.walk_packages(hyperpod_lab.__path__, "hyperpod_lab."):
            if m.name.endswith("__main__") or m.name == "hyperpod_lab.node.launch":
                continue
            if m.name.startswith("hyperpod_lab.runtime.") and m.name not in shims:
                continue
            importlib.import_module(m.name)
            names.append(m.name)
        assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "torchft")]
        for part in ("node", "fold", "submit", "server", "notebook", "cli", "schedulers", "goodput"):
            assert any(n.startswith(f"hyperpod_lab.{part}.") for n in names), part
        assert {"hyperpod_lab.jobdir", "hyperpod_lab.events", "hyperpod_lab.spec"} <= set(names)
        assert "hyperpod_lab.node.supervisor" in names and "hyperpod_lab.node.health" in names
        print("OK", len(names))
    """)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]
    assert int(res.stdout.split()[-1]) >= 60, res.stdout


def test_scale_on_the_local_backend_runs_without_torch_in_the_submitting_process(tmp_path):
    """Submit a checkpointless job to the local backend, add a node (``scale``) and cancel, all
    from a process where torch cannot be imported; the job's processes train with torch, and
    the cancel ends every one of them (a group-wide SIGTERM used to leave an agent hanging)."""
    res = _run_without_torch(f"""
        import json, sys, time
        from hyperpod_lab.submit.client import Client
        from hyperpod_lab.events import EventReader
        from hyperpod_lab.submit.jobs import JobStore
        from hyperpod_lab.spec import JobSpec

        client = Client(JobStore({str(tmp_path / "jobs")!r}))
        spec = JobSpec.from_dict({{"script": {SCRIPT!r}, "cluster": "local", "name": "no-torch", "nodes": 2,
                                  "procs_per_node": 1, "resiliency": {{"recovery": "checkpointless"}},
                                  "elastic": {{"min_nodes": 1, "max_nodes": 3}},
                                  "env": {{"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.001", "RUST_LOG": "warn"}},
                                  "args": ["--steps", "400", "--step-sleep", "0.2", "--no-checkpoint"]}})
        rec = client.submit(spec)
        reader, seen = EventReader(rec.job_dir), []

        def wait_for(pred, what, timeout=150):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                seen.extend(reader.poll())
                if any(pred(e) for e in seen):
                    return
                time.sleep(0.2)
            raise SystemExit(f"timed out waiting for {{what}}: " + client.logs(rec.job_id)[-3000:])

        try:
            wait_for(lambda e: e.kind == "step" and e.data.get("step", -1) >= 3, "step 3")
            join = client.scale(rec.job_id, 1)
            wait_for(lambda e: e.kind == "checkpoint.restored" and e.data.get("replica_group") == 2,
                     "group 2 joining")
        finally:
            client.cancel(rec.job_id)
        # cancel ends every process of the job (the driver, the Lighthouse, both first agents,
        # the joined one and their workers), none left hanging
        from hyperpod_lab.procs import process_job_id
        import os
        deadline, left = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            left = [p for p in os.listdir("/proc") if p.isdigit() and process_job_id(int(p)) == rec.job_id]
            if not left:
                break
            time.sleep(0.5)
        assert not left, f"processes of the cancelled job still run: {{left}}"
        assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "torchft")]
        print(json.dumps(join))
    """)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    join = json.loads(res.stdout.strip().splitlines()[-1])
    assert join["offset"] == 2 and join["nodes"] == 1


def _imports(path: str) -> list[tuple[int, str]]:
    tree = ast.parse(open(path).read(), path)
    out = []
    for node in ast.walk(tree):  # every import, also those inside functions (lazy ones)
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
    return out


def _modules():
    for root, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                yield os.path.relpath(path, ROOT), path


def test_imports_that_must_never_exist():
    """The submit side never names torch, torchft or the runtime; the runtime never names Jupyter,
    tornado, ipywidgets, paramiko or the submit side (docs/architecture.md)."""
    runtime_may_not = ("jupyter_server", "jupyterlab", "tornado", "ipywidgets", "IPython", "paramiko", "boto3.session")
    submit_side = ("hyperpod_lab.server", "hyperpod_lab.submit.client", "hyperpod_lab.schedulers", "hyperpod_lab.cli",
                   "hyperpod_lab.notebook.magics", "hyperpod_lab.notebook.widgets", "hyperpod_lab.submit.discovery", "hyperpod_lab.devcluster")
    # the one node-side module that is torch: the launch agent subclasses torchrun's elastic agent
    torchrun_agent = os.path.join("hyperpod_lab", "node", "launch.py")
    bad = []
    for rel, path in _modules():
        in_runtime = rel.startswith(os.path.join("hyperpod_lab", "runtime") + os.sep)
        for line, mod in _imports(path):
            top = mod.split(".")[0]
            if rel == torchrun_agent and top == "torch":
                continue
            if not in_runtime and (top in ("torch", "torchft") or mod.startswith("hyperpod_lab.runtime")):
                bad.append(f"{rel}:{line} imports {mod} (submit side -> torch)")
            if in_runtime and (mod.startswith(runtime_may_not[:-1]) or mod == "boto3.session"
                               or mod.startswith(submit_side)):
                bad.append(f"{rel}:{line} imports {mod} (runtime -> Jupyter/submit side)")
    assert not bad, "\n".join(bad)


def test_env_names_are_written_only_through_the_contract():
    """No module but jobdir spells a ``HYPERPOD_LAB_*`` variable (the job's, or the submit side's
    and the dev cluster's) in a string literal in code (docstrings and comments aside, f-string
    parts included): every writer and reader uses jobdir's ``ENV_*`` constants."""
    env_vars = {v for k, v in vars(jobdir).items() if k.startswith("ENV_")}
    assert all(v.startswith("HYPERPOD_LAB_") for v in env_vars), env_vars
    bad = []
    for rel, path in _modules():
        if rel == os.path.join("hyperpod_lab", "jobdir.py"):
            continue
        tree = ast.parse(open(path).read(), path)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if "HYPERPOD_LAB_" in node.value:
                    bad.append(f"{rel}:{node.lineno} spells {node.value[:80]!r}")
    assert not bad, "\n".join(bad)


def test_job_paths_layout_is_shared_by_submitter_and_runtime():
    """The submitter's JobPaths (for_job) and the runtime's (from_env) name the same files."""
    submit = JobPaths.for_job("/fsx", "j-1")
    assert submit.folder == "/fsx/hyperpod-lab/jobs/j-1"
    run = JobPaths.from_env({jobdir.ENV_JOB_DIR: submit.folder})
    for attr in ("spec", "events", "logs", "ranks", "checkpoints", "joins", "lighthouse", "exit_code", "cancelled"):
        assert getattr(run, attr) == getattr(submit, attr)
    assert run.rank_file(3) == "/fsx/hyperpod-lab/jobs/j-1/ranks/rank-3.json"
    assert run.event_file("rank-3") == "/fsx/hyperpod-lab/jobs/j-1/events/rank-3.jsonl"
    assert submit.script("/home/me/train.py") == "/fsx/hyperpod-lab/jobs/j-1/script/train.py"
    assert JobPaths.rank_of("rank-12.json") == 12 and JobPaths.rank_of("rank-x.json") is None
    assert JobPaths.from_env({}) is None


def test_restart_count_and_launcher_argv_are_defined_once():
    spec = JobSpec.from_dict({"script": "train.py", "nodes": 2, "procs_per_node": 4,
                              "resiliency": {"auto_resume": True, "max_retries": 5}})
    assert jobdir.effective_restarts(spec.resiliency) == 5
    spec.resiliency.auto_resume = False
    assert jobdir.effective_restarts(spec.resiliency) == 0
    argv = jobdir.launcher_argv("/py", "s.py", ["--x", "a b"], standalone=True, nproc_per_node=4, max_restarts=2,
                                log_dir="/j/logs/torchrun", monitor_interval=0.1)
    assert argv == ["/py", "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1", "--nproc-per-node=4",
                    "--max-restarts=2", "--monitor-interval=0.1", "--log-dir=/j/logs/torchrun", "--redirects=3",
                    "--tee=3", "s.py", "--x", "a b"]
    # the runtime's launcher (torchrun's own parser) reads every option the contract writes
    from hyperpod_lab.node import launch
    args = launch._torchrun.parse_args(argv[3:])
    assert (args.standalone, args.nproc_per_node, args.max_restarts, args.monitor_interval) == (True, "4", 2, 0.1)
    assert (args.training_script, args.training_script_args) == ("s.py", ["--x", "a b"])


def test_the_fault_request_is_defined_once_and_validated_on_both_ends():
    """jobdir.FaultRequest is what the submit side writes (Scheduler._write_request) and what a
    rank reads (JobContext.check_injected_fault): strict when built, never refused when obeyed."""
    import pytest

    from hyperpod_lab.errors import SpecError
    from hyperpod_lab.jobdir import FAULT_KINDS, FaultKind, FaultRequest, fault_kind, slow_factor

    assert FAULT_KINDS == ("kill", "node", "exception", "hang", "slow") and jobdir.DEFAULT_FAULT_KIND == "kill"
    assert (jobdir.MIN_SLOW_FACTOR, jobdir.DEFAULT_SLOW_FACTOR, jobdir.MAX_SLOW_FACTOR) == (1.0, 2.0, 100.0)
    req = FaultRequest(kind=FaultKind.SLOW.value, message="m", time=1.5, nonce="ab", factor=3.0)
    assert json.loads(req.to_json()) == {"kind": "slow", "message": "m", "time": 1.5, "nonce": "ab", "factor": 3.0}
    assert FaultRequest.from_json(req.to_json()) == req == FaultRequest.obeyed(req.to_json().encode())
    with pytest.raises(SpecError, match="kind: must be one of kill, node, exception, hang, slow, got 'boom'"):
        fault_kind("boom")
    with pytest.raises(SpecError, match="factor: must be a number from 1 .normal speed. to 100"):
        slow_factor("slow", 101)
    with pytest.raises(SpecError, match="factor: is only for --kind slow, not hang"):
        FaultRequest.from_json('{"kind": "hang", "message": "m", "time": 1, "nonce": "a", "factor": 2}')
    with pytest.raises(SpecError, match="fault_request: must be a JSON object"):
        FaultRequest.from_json("[]")
    # a rank obeys what it can: a malformed request is an exception, a slow factor is capped
    assert FaultRequest.obeyed(b"not json").kind == "exception"
    assert FaultRequest.obeyed(b'{"kind": "slow", "factor": 500}').factor == 100.0
    assert FaultRequest.obeyed(b'{"kind": "slow", "factor": "x"}').factor == 2.0


def test_event_kinds_are_the_same_in_python_typescript_and_the_openapi_description():
    """The schema is defined once (hyperpod_lab.events.EventKind) and mirrored in src/api/events.ts
    (EVENT_KINDS) and docs/openapi.yaml (Event.kind): a kind added to one is added to all."""
    import re

    import yaml

    from hyperpod_lab.events import EventKind

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    kinds = [k.value for k in EventKind]
    with open(os.path.join(root, "src", "api", "events.ts")) as f:
        block = re.search(r"export const EVENT_KINDS = \[(.*?)\] as const", f.read(), re.S).group(1)
    assert re.findall(r"'([^']+)'", block) == kinds
    with open(os.path.join(root, "docs", "openapi.yaml")) as f:
        api = yaml.safe_load(f)
    assert api["components"]["schemas"]["Event"]["properties"]["kind"]["enum"] == kinds
    with open(os.path.join(root, "docs", "events.md")) as f:
        doc = f.read()
    assert all(f"| `{k}` |" in doc for k in kinds), [k for k in kinds if f"| `{k}` |" not in doc]


def test_the_typescript_mirrors_of_the_fault_request_and_fault_reasons_equal_the_python_ones():
    """The fault-injection request is defined once in Python (``jobdir``: kinds, default kind and
    slow-factor limits) and the fault reasons and health writer prefix once in ``events``; the
    Lab's ``src/api/faults.ts`` and ``src/api/events.ts`` mirror them and must say the same."""
    import re

    from hyperpod_lab import events

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "src", "api", "faults.ts")) as f:
        faults = f.read()
    kinds = re.search(r"export const FAULT_KINDS: readonly FaultKind\[\] = \[(.*?)\];", faults, re.S).group(1)
    assert tuple(re.findall(r"'([^']+)'", kinds)) == jobdir.FAULT_KINDS
    kind_type = re.search(r"export type FaultKind = (.*?);", faults, re.S).group(1)
    assert tuple(re.findall(r"'([^']+)'", kind_type)) == jobdir.FAULT_KINDS
    for name in ("DEFAULT_SLOW_FACTOR", "MIN_SLOW_FACTOR", "MAX_SLOW_FACTOR"):
        ts = float(re.search(rf"export const {name} = ([0-9.]+);", faults).group(1))
        assert ts == getattr(jobdir, name), name
    with open(os.path.join(root, "src", "api", "events.ts")) as f:
        ev = f.read()
    assert re.search(r"export const HEALTH_WRITER_PREFIX = '([^']+)';", ev).group(1) == events.HEALTH_WRITER_PREFIX
    block = re.search(r"export const FAULT_REASONS = \{(.*?)\} as const;", ev, re.S).group(1)
    assert sorted(re.findall(r"'([^']+)'", block)) == sorted(r.value for r in events.FaultReason)
