"""Shared fixtures. Every test runs with its own cluster config and job store (never the
user's), set before any hyperpod_lab import reads them."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import pytest

_SESSION_DIR = tempfile.mkdtemp(prefix="hyperpod-lab-tests-")
atexit.register(shutil.rmtree, _SESSION_DIR, True)  # each pytest process (xdist worker) its own
os.environ["HYPERPOD_LAB_CONFIG"] = os.path.join(_SESSION_DIR, "clusters.toml")
os.environ["HYPERPOD_LAB_DATA_DIR"] = os.path.join(_SESSION_DIR, "data")
os.environ.setdefault("HYPERPOD_LAB_CLUSTER", "local")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # helpers shared with the benchmarks: ``from benchmarks._common import ...``
    sys.path.insert(0, REPO)


# a test shares the one dev cluster (its 3 nodes, which tests mark DOWN; its 'local-slurm' profile in
# the session's config) when its function or one of its fixtures names one of these
_DEV_CLUSTER_WORDS = ("dev_cluster", "devcluster", "local-slurm", "scontrol")
_NAMES_THE_CLUSTER: dict[object, bool] = {}


def _names_the_cluster(func) -> bool:
    if func not in _NAMES_THE_CLUSTER:
        import inspect

        try:
            text = inspect.getsource(func)
        except (OSError, TypeError):
            text = ""
        _NAMES_THE_CLUSTER[func] = any(w in text for w in _DEV_CLUSTER_WORDS)
    return _NAMES_THE_CLUSTER[func]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the group
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, as scripts/test.sh runs it): every test that
    uses the one dev cluster runs on one worker, in collection order, as in a serial run; the other
    tests of a module share a worker (its module-scoped fixtures start once per worker). Without
    xdist the marker is inert."""
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
        funcs = [getattr(item, "function", None)] + [d.func for ds in defs.values() for d in ds]
        shared = "dev_cluster" in getattr(item, "fixturenames", ()) or any(
            f is not None and _names_the_cluster(f) for f in funcs)
        item.add_marker(pytest.mark.xdist_group("dev-cluster" if shared else item.nodeid.split("::")[0]))


def require(tool: str, how: str) -> str:
    """Path of ``tool``; fail (never skip) with how to install it when missing."""
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed; {how}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def dev_cluster():
    """The real local dev cluster (munge, slurmctld, 2 slurmd, slurmdbd+MariaDB, sshd), up once
    per session; its 'local-slurm' profile is written to this session's config file."""
    from hyperpod_lab import devcluster

    if os.geteuid() != 0:
        pytest.fail("the dev-cluster tests need root (they install and start Slurm); run them as root "
                    "or via 'bash scripts/test.sh'", pytrace=False)
    return devcluster.up(quiet=True)


@pytest.fixture
def ipython(tmp_path, monkeypatch):
    """The process's one IPython shell (IPython's test shell: one per process, so every test that
    needs a shell takes this one, never a second kind) with ``%load_ext hyperpod_lab``, working in
    ``tmp_path``."""
    from IPython.testing.globalipapp import get_ipython, start_ipython

    monkeypatch.chdir(tmp_path)
    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "hyperpod_lab")
    return ip


@pytest.fixture
def client(tmp_path):
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    return Client(JobStore(str(tmp_path / "jobs")))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real jupyter server with hyperpod-lab's extension for the test module (its own root and
    runtime dirs); after the module, no handler may have skipped jupyter-server's authorization."""
    from jupyter_server_proc import JupyterServer

    srv = JupyterServer(str(tmp_path_factory.mktemp("root")), str(tmp_path_factory.mktemp("server")))
    srv.start()
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()
