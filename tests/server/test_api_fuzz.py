"""API fuzzing from docs/openapi.yaml with schemathesis (issue 13: no 500, no response that
breaks the schema).

A real jupyter-server with the extension runs on loopback (tests/jupyter_server_proc.py). For
every documented REST operation, schemathesis generates valid and invalid requests (path ids,
query values such as huge cursors, 1e308 and NaN, bodies with NUL bytes and deep nesting);
each response must not be a 5xx and must match the documented schema and content type. Two
extra cases are sent by hand because generators rarely reach them: a 100,000-deep JSON body
and a NUL byte in a path.

Left out: the WebSocket (not HTTP; tests/server/test_server.py and tests/server/test_server_bounds.py), and
``/hyperpod/discover``, which calls the SageMaker API with the server's AWS credentials
(tested against moto in tests/submit/test_discovery.py); running jobs is not fuzzed: the server's
root holds one script, ``t.py``, that schemathesis cannot name (it generates other paths), used
only by the hand-written refused submissions below.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import schemathesis
except ImportError:  # a missing tool fails with how to install it, never skips
    pytest.fail("schemathesis is not installed; run 'bash scripts/setup.sh' (it installs .[test])", pytrace=False)
from jupyter_server_proc import JupyterServer
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPENAPI = os.path.join(REPO, "docs", "openapi.yaml")
EXAMPLES = int(os.environ.get("HYPERPOD_LAB_FUZZ_EXAMPLES", "60"))
SKIP = {"/hyperpod/discover"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-root")
    (root / "t.py").write_text("raise SystemExit('the fuzz test never runs a job')\n")  # only for refused specs
    srv = JupyterServer(str(root), str(tmp_path_factory.mktemp("fuzz-server"))).start()
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def _operations():
    schema = schemathesis.openapi.from_path(OPENAPI)
    ops = []
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in SKIP or (op.definition.raw or {}).get("x-websocket"):
            continue
        ops.append(op)
    return ops


OPERATIONS = _operations()


@pytest.mark.parametrize("op", OPERATIONS, ids=[f"{o.method.upper()} {o.path}" for o in OPERATIONS])
def test_no_operation_answers_5xx_or_breaks_its_schema(server, op):
    headers = {"Authorization": f"token {server.token}"}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)))
    def check(case):
        response = case.call(base_url=server.url, headers=headers, timeout=60)
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                                 content_type_conformance])

    statuses: list[int] = []
    check()
    assert len(statuses) >= min(EXAMPLES, 10), statuses  # the server was really asked


def _raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    return server.call(method, path, raw=body)


def test_a_100000_deep_json_body_is_a_400_naming_the_body(server):
    deep = b'{"spec": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    status, body = _raw(server, "POST", "/hyperpod/jobs", deep)
    assert status == 400 and body["error"]["field"] == "body", body


@pytest.mark.parametrize("path", ["/hyperpod/jobs/a%00b", "/hyperpod/clusters/a%00b",
                                  "/hyperpod/jobs/a%00b/events?cursor=%00", "/hyperpod/goodput/advice?instances=1"
                                  "&failure_rate=1e308&checkpoint_cost_s=1e308&step_time_s=nan"])
def test_nul_bytes_and_extreme_numbers_are_4xx(server, path):
    status, body = _raw(server, "GET", path)
    assert 400 <= status < 500 and "error" in body, (status, body)


@pytest.mark.parametrize("spec", [
    {"script": "a\u0000b"}, {"script": "t.py", "env": {"A": "x\u0000y"}}, {"script": "t.py", "args": ["x\u0000y"]},
    {"script": "t.py", "nodes": 10**400}, {"script": "t.py", "nodes": 1e308}, {"script": "t.py", "time_limit_min": 10**30},
    {"script": "t.py", "checkpoint": {"every_steps": 10**30}}, {"script": "t.py", "resiliency": {"max_retries": 10**30}},
])
def test_submissions_with_nul_bytes_or_huge_numbers_are_a_400_naming_the_field(server, spec):
    """Reproduced before the fix: NUL bytes gave 500 (embedded null byte), 10**400 nodes and
    10**30 minutes were accepted (201)."""
    status, body = _raw(server, "POST", "/hyperpod/jobs", json.dumps({"spec": {"cluster": "local", **spec}}).encode())
    assert status == 400 and body["error"]["field"], (status, body)


def test_a_notebook_path_with_a_nul_byte_is_a_400(server):
    status, body = _raw(server, "POST", "/hyperpod/jobs",
                        json.dumps({"notebook": "a\u0000b.ipynb", "spec": {"cluster": "local"}}).encode())
    assert status == 400 and body["error"]["field"] == "notebook", (status, body)
