"""Shared fixtures. Every test runs with its own cluster config and job store (never the
user's), set before any hyperpod_lab import reads them."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

_SESSION_DIR = tempfile.mkdtemp(prefix="hyperpod-lab-tests-")
os.environ["HYPERPOD_LAB_CONFIG"] = os.path.join(_SESSION_DIR, "clusters.toml")
os.environ["HYPERPOD_LAB_DATA_DIR"] = os.path.join(_SESSION_DIR, "data")
os.environ.setdefault("HYPERPOD_LAB_CLUSTER", "local")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # helpers shared with the benchmarks: ``from benchmarks._common import ...``
    sys.path.insert(0, REPO)


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
