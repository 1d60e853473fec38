"""Log search never stops the server (issue 24, finding 1), with a real jupyter-server and a real job.

Reproduced on the code before the fix: the log search compiled ``q`` with Python's ``re``,
guarded by a heuristic that looked only at innermost groups. ``((\\w+\\s?))+$`` passed it and
backtracked for seconds on a 25-character line of a rank's log (doubling per character);
``re`` holds the GIL while it matches, so every other request of the server (here the jobs
list) waited behind the search. Now the search runs on RE2 (linear time): both answer at once.
"""

from __future__ import annotations

import threading
import time
import urllib.parse

import pytest
from slurm_jobs import Follow

from hyperpod_lab import cli
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStatus, JobStore

EVIL = r"((\w+\s?))+$"
LINE = "a" * 25 + "!"  # Python's re: ~4 s on this pattern (x2 per character); RE2: microseconds

SCRIPT = f'''
import hyperpod_lab.runtime as hp

with hp.init() as ctx:
    for i in range(3):
        print({LINE!r}, flush=True)
    print("padding " * 20, flush=True)
    print("done", flush=True)
'''


@pytest.fixture(scope="module")
def evil_job(tmp_path_factory):
    """A real job on the built-in ``local`` cluster whose rank 0 printed lines the pattern
    backtracks on."""
    script = tmp_path_factory.mktemp("redos") / "evil_lines.py"
    script.write_text(SCRIPT)
    client = Client(JobStore())
    job_id = cli.run(["submit", str(script), "--cluster", "local", "--name", "redos"], client=client)
    job = Follow(client, job_id)
    job.until(lambda: JobStatus(client.status(job_id).status).is_terminal(), "the end", timeout=180)
    return job_id


def _triage(server, job_id, timeout_s=120.0, **params):
    q = urllib.parse.urlencode(params)
    return server.call("GET", f"/hyperpod/jobs/{job_id}/logs/triage?{q}", timeout_s=timeout_s)


def test_the_job_log_holds_the_evil_lines(server, evil_job):
    status, body = _triage(server, evil_job, q=LINE, failure=0)  # a plain substring search
    assert status == 200, body
    assert len(body["matches"]) == 3 and body["done"] is True, body


def test_an_evil_search_never_stalls_another_request(server, evil_job):
    result: dict = {}

    def search():
        t0 = time.monotonic()
        result["reply"] = _triage(server, evil_job, q=EVIL, regex=1, failure=0)
        result["search_s"] = time.monotonic() - t0

    worker = threading.Thread(target=search)
    worker.start()
    time.sleep(0.3)  # the search is on the server now (before the fix: matching, holding the GIL)
    t0 = time.monotonic()
    status, jobs = server.call("GET", "/hyperpod/jobs", timeout_s=120)
    other_s = time.monotonic() - t0
    worker.join(180)
    assert status == 200 and any(j["job_id"] == evil_job for j in jobs["jobs"] if isinstance(j, dict)), jobs
    assert other_s < 1.0, (f"the jobs list took {other_s:.1f} s while a log search ran "
                           f"(the search took {result.get('search_s', float('nan')):.1f} s)")
    status, body = result["reply"]
    assert status == 200, body
    # RE2 matches these lines (leftmost, then the longest run of words before the end): none ends in a word
    assert body["matches"] == [] or all(m["text"] != LINE for m in body["matches"]), body["matches"]
    assert body["done"] is True and result["search_s"] < 5.0, result


@pytest.mark.parametrize("q, construct", [(r"(a)\1", "backreference"), (r"error(?=: rank)", "lookahead"),
                                          (r"(?<!warn)ing", "lookbehind"), (r"(?P<x>a)(?P=x)", "backreference")])
def test_a_pattern_re2_cannot_run_is_a_400_naming_it_and_the_fix(server, evil_job, q, construct):
    status, err = _triage(server, evil_job, q=q, regex=1)
    assert status == 400, err
    e = err["error"]
    assert e["type"] == "SpecError" and e["field"] == "q", e
    assert construct in e["message"] and "plain substring" in e["message"] and "RE2-compatible" in e["message"], e
