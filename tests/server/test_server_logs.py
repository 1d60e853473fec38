"""No token in the server's log (issue 13, finding 6).

Reproduced on the code before the fix: a 4xx of ours logged ``self.request.uri`` raw, so a
request authenticated with ``?token=...`` (how a shared link or a script reaches the API)
wrote the token into the log.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from jupyter_server_proc import JupyterServer

TOKEN = "hyperpod-log-secret-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = JupyterServer(str(tmp_path_factory.mktemp("root")), str(tmp_path_factory.mktemp("server")),
                        token=TOKEN).start()
    yield srv
    srv.stop()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("path", ["/hyperpod/jobs/no-such-job", "/hyperpod/jobs/no-such-job/events",
                                  "/hyperpod/clusters/no-such-cluster", "/hyperpod/jobs?limit=x",
                                  "/hyperpod/goodput/advice?instances=0", "/api/contents/missing"])
def test_query_tokens_never_reach_the_log(server, path):
    sep = "&" if "?" in path else "?"
    status = _get(f"{server.url}{path}{sep}token={TOKEN}")
    assert 400 <= status < 500 or status == 200, status
    text = server.log_text()
    assert TOKEN not in text, [line for line in text.splitlines() if TOKEN in line]
    assert "[secret]" in text or "token=" not in text


def test_redact_covers_headers_and_credential_parameters():
    from hyperpod_lab.server.redact import redact

    assert redact("GET /x?token=abc&limit=1") == "GET /x?token=[secret]&limit=1"
    assert redact("GET /x?_xsrf=abc") == "GET /x?_xsrf=[secret]"
    assert "abc" not in redact("{'Authorization': 'token abc'}") and "abc" not in redact("Authorization: Bearer abc")
    assert redact("monkey=1&limit=2") == "monkey=1&limit=2"
