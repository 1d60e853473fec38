"""Per-rank log triage (issue 18, item 3), with real parts:

* a real 2-rank job on the built-in ``local`` cluster (torchrun, torch.distributed with gloo,
  tests/scripts/triage_job.py) into which ``inject-fault --kind exception --rank 1`` is
  injected: rank 1 is the first failing rank (from its ``fault.detected`` event, and without
  events from torchrun's error.json), its traceback's byte offset points at
  ``Traceback (most recent call last):`` in rank 1's log file, lines both ranks print collapse
  with ranks {0, 1};
* a real ``Fatal Python error`` (a segfault under faulthandler) and the ChildFailedError report
  torch.distributed.elastic prints, through the traceback finder;
* the REST route of a real jupyter-server: bounded reads of a 50 MB log (the reply's ``read``
  and ``bytes_read``), a search continued with its cursor, a scan bound, follow mode on a
  running job (each poll gets only new lines), 400s naming the field;
* the CLI (``hyperpod-lab logs JOB --triage`` / ``--grep``);
* one job on the Slurm dev cluster: the same triage over SSH/SFTP finds rank 1.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import urllib.parse

import pytest
from slurm_jobs import Follow

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.submit import logtriage as lt
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "triage_job.py")
TB = b"Traceback (most recent call last):"


def _run_failing_job(client, cluster: str, extra: list[str], steps: int = 12, timeout: float = 300) -> str:
    """Submit triage_job.py, inject an exception into rank 1 at step >= 3, wait for the end."""
    job_id = cli.run(["submit", SCRIPT, "--cluster", cluster, *extra, "--name", "triage",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                      "--", "--steps", str(steps), "--sleep", "0.1"], client=client)
    job = Follow(client, job_id)
    job.until(lambda: any(e.data["step"] >= 3 for e in job.kinds("step")), "step 3", timeout=timeout)
    client.inject_fault(job_id, 1, kind="exception")
    job.until(lambda: job.kinds("fault.detected"), "fault.detected", timeout=timeout)
    job.until(lambda: job.kinds("finished") or job.kinds("job.failed") or _over(client, job_id), "the end",
              timeout=timeout)
    return job_id


def _over(client, job_id) -> bool:
    from hyperpod_lab.submit.jobs import JobStatus

    return JobStatus(client.status(job_id).status).is_terminal()


@pytest.fixture(scope="module")
def store_client():
    """A client on the default job store (the one a jupyter-server of this session reads)."""
    return Client(JobStore())


@pytest.fixture(scope="module")
def failed_job(store_client):
    return _run_failing_job(store_client, "local", ["--procs-per-node", "2"])


def _logs(client, job_id):
    rec = client.get(job_id)
    return lt.RankLogs(client.scheduler(rec.cluster), rec)


# ---------------------------------------------------------------------------- (a) the core
def test_first_failing_rank_and_its_traceback_offset(store_client, failed_job):
    logs = _logs(store_client, failed_job)
    assert logs.ranks() == [0, 1]
    faults = lt.read_fault_events(logs.sched.remote, logs.rec.job_dir)
    assert any(f["data"]["rank"] == 1 and "InjectedFault" in f["data"]["reason"] for f in faults), faults
    for events, by in ((faults, "event"), (None, "error_file")):
        f = lt.first_failure(logs, [0, 1], events)
        assert f["rank"] == 1 and f["found_by"] == by, f
        assert f["node"] == logs.node(1) and f["node"]
        assert f["attempt"] == 0 and f["source"].endswith("attempt_0/1/stderr.log"), f
        path = os.path.join(logs.rec.job_dir, f["source"])
        with open(path, "rb") as fh:
            data = fh.read()
        # the byte offset points at the traceback line in rank 1's own log file
        assert data[f["offset"]:f["offset"] + len(TB)] == TB
        assert f["traceback_text"].startswith(TB.decode()) and "check_injected_fault" in f["traceback_text"]
        assert "InjectedFault: hyperpod-lab inject-fault: exception injected into rank 1" in f["exception"]
        assert data[f["exception_offset"]:].startswith(f["exception"].encode())
        assert f["end"] <= len(data)
    # rank 0 failed too (its peer closed the connection): a secondary failure, never the first
    tbs0 = [tb for s in logs.sources(0) if s.stream == "stderr"
            for tb in lt.find_tracebacks(lt.split_lines(open(s.path, "rb").read(), 0, True, True)[0])]
    assert tbs0 and all(tb.secondary for tb in tbs0), [tb.exception for tb in tbs0]
    only0 = lt.first_failure(logs, [0], None)
    assert only0["rank"] == 0 and only0["found_by"] == "error_file"


def test_lines_printed_by_both_ranks_collapse(store_client, failed_job):
    logs = _logs(store_client, failed_job)
    view = lt.read_view(logs, [0, 1], {}, lt.DEFAULT_LENGTH, tail=False, at_eof=True)
    first = [ln for ln in view["lines"] if ln["attempt"] == 0 and ln["stream"] == "stdout"]
    by_text = {ln["text"]: ln for ln in first}
    assert by_text["loading data..."]["ranks"] == [0, 1]
    assert by_text["model: 2 layers, 1024 parameters"]["ranks"] == [0, 1]
    assert by_text["step 0 world 2"]["ranks"] == [0, 1]
    assert by_text["rank 0 says hello"]["ranks"] == [0] and by_text["rank 1 says hello"]["ranks"] == [1]
    assert [ln["text"] for ln in first[:2]] == ["loading data...", "model: 2 layers, 1024 parameters"]
    # each rank's offsets point at the line in its own file, in order
    for r in (0, 1):
        src = next(s for s in logs.sources(r) if s.attempt == 0 and s.stream == "stdout")
        data = open(src.path, "rb").read()
        offs = [ln["offsets"][r] for ln in first if r in ln["ranks"]]
        assert offs == sorted(offs) and len(offs) == data.count(b"\n")
        for ln in first:
            if r in ln["ranks"]:
                assert data[ln["offsets"][r]:].startswith(ln["text"].encode())
    # the restart is its own attempt: its lines collapse too, after attempt 0's
    again = [ln for ln in view["lines"] if ln["attempt"] == 1 and ln["text"] == "done"]
    assert again and again[0]["ranks"] == [0, 1]
    text = lt.format_view(view, lt.first_failure(logs, [0, 1], None))
    assert "[ranks 0-1]  loading data..." in text and "first failure: rank 1" in text


def test_collapse_keeps_each_ranks_order():
    def lines(*texts):
        return [lt.Line(t, i * 10, i * 10 + 10) for i, t in enumerate(texts)]

    out = lt.collapse({0: lines("a", "x0", "b", "c"), 1: lines("a", "b", "x1", "c"), 2: lines("a", "b", "c")})
    assert [(o["text"], o["ranks"]) for o in out] == [("a", [0, 1, 2]), ("x0", [0]), ("b", [0, 1, 2]),
                                                       ("x1", [1]), ("c", [0, 1, 2])]
    assert lt.rank_set_label([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert lt.parse_ranks(" 0, 2-4,2 ") == [0, 2, 3, 4] and lt.parse_ranks("") is None
    for bad in ("x", "3-1", "0-100000", "1;2", "-1"):
        with pytest.raises(SpecError, match="ranks"):
            lt.parse_ranks(bad)


def test_fatal_python_error_and_child_failed_blocks(tmp_path):
    # a real segfault under faulthandler
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", "print('about to crash', flush=True)\n"
                        "import ctypes; ctypes.string_at(0)"], capture_output=True)
    assert p.returncode != 0
    data = p.stdout + p.stderr
    tbs = lt.find_tracebacks(lt.split_lines(data, 0, True, True)[0])
    assert tbs and tbs[0].kind == "fatal" and tbs[0].exception.startswith("Fatal Python error: Segmentation fault")
    assert data[tbs[0].offset:].startswith(b"Fatal Python error")
    # the report torch.distributed.elastic prints when the agent gives up (its format, as printed)
    report = ("[default0]:step 1\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
              "============================================================\n"
              "train.py FAILED\n"
              "------------------------------------------------------------\n"
              "Failures:\n  <NO_OTHER_FAILURES>\n"
              "------------------------------------------------------------\n"
              "Root Cause (first observed failure):\n[0]:\n"
              "  time      : 2026-11-24_00:28:48\n  host      : n2\n  rank      : 1 (local_rank: 0)\n"
              "  exitcode  : 1 (pid: 123)\n  error_file: /x/error.json\n"
              "============================================================\n").encode()
    tbs = lt.find_tracebacks(lt.split_lines(report, 0, True, True)[0])
    assert len(tbs) == 1 and tbs[0].kind == "childfailed" and tbs[0].rank == 1 and tbs[0].host == "n2"
    assert report[tbs[0].offset:].startswith(b"ChildFailedError")
    # a chained traceback is one block ending at the last exception
    chained = (b"[rank3]: Traceback (most recent call last):\n[rank3]:   File \"a.py\", line 1\n"
               b"[rank3]: KeyError: 'x'\n[rank3]: \n[rank3]: During handling of the above exception, another "
               b"exception occurred:\n[rank3]: \n[rank3]: Traceback (most recent call last):\n"
               b"[rank3]:   File \"a.py\", line 3\n[rank3]: ValueError: bad\nnext line\n")
    tbs = lt.find_tracebacks(lt.split_lines(chained, 100, True, True)[0])
    assert len(tbs) == 1 and tbs[0].exception == "ValueError: bad" and tbs[0].offset == 100 + len(b"[rank3]: ")


def test_cli_triage_and_grep(store_client, failed_job):
    out = io.StringIO()
    cli.run(["logs", failed_job, "--triage"], client=store_client, out=out)
    text = out.getvalue()
    assert "[ranks 0-1]  loading data..." in text and "first failure: rank 1" in text, text[-2000:]
    assert "InjectedFault" in text
    out = io.StringIO()
    cli.run(["logs", failed_job, "--grep", "says hello"], client=store_client, out=out)
    assert "[rank 0]" in out.getvalue() and "rank 1 says hello" in out.getvalue(), out.getvalue()


# ---------------------------------------------------------------------------- (b) REST
# ``server``: a real jupyter server for the module (tests/conftest.py)


def _get(server, job_id, **params):
    q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    return server.call("GET", f"/hyperpod/jobs/{job_id}/logs/triage" + (f"?{q}" if q else ""))


def test_rest_view_first_failure_and_bad_parameters(server, failed_job):
    status, body = _get(server, failed_job)
    assert status == 200, body
    f = body["first_failure"]
    assert f["rank"] == 1 and f["found_by"] == "event" and "InjectedFault" in f["exception"]
    assert any(ln["text"] == "loading data..." and ln["ranks"] == [0, 1] for ln in body["lines"])
    status, win = _get(server, failed_job, around="traceback", ranks="1", length=4096)
    assert status == 200 and win["first_failure"]["rank"] == 1
    hit = [ln for ln in win["lines"] if ln["offsets"]["1"] <= f["offset"] < ln["offsets"]["1"] + len(ln["text"]) + 1]
    assert hit and "Traceback (most recent call last):" in hit[0]["text"], win["lines"]
    for params, field in (({"ranks": "x"}, "ranks"), ({"length": 0}, "length"), ({"length": 2 << 20}, "length"),
                          ({"q": "(", "regex": 1}, "q"), ({"q": r"(a)\1", "regex": 1}, "q"), ({"around": "everything"}, "around"),
                          ({"cursor": "garbage!"}, "cursor"), ({"time": "soon"}, "time"), ({"tail": "yes"}, "tail"),
                          ({"scan": 1 << 40}, "scan"), ({"q": "x" * 201}, "q")):
        status, err = _get(server, failed_job, **params)
        assert status == 400 and err["error"]["field"] == field, (params, status, err)
    assert _get(server, "no-such-job")[0] == 404
    # odd values of every parameter on a real job: a 4xx or an answer, never a 5xx
    nasty = ["", "0", "1", "-1", "1e308", "nan", "\u0000", "x" * 300, "0,1,1-0", "999999", "%", "(?i)", ".*" * 50]
    for name in ("ranks", "cursor", "length", "tail", "q", "regex", "scan", "limit", "around", "time", "failure"):
        for value in nasty:
            status, body = _get(server, failed_job, **{name: value})
            assert status < 500, (name, value, status, body)
    status, err = _get(server, failed_job, ranks="7")
    assert status == 409 and "rank 7" in err["error"]["message"] and "known ranks: [0, 1]" in err["error"]["message"]


def test_rest_reads_are_bounded_on_a_50_mb_log(server, store_client, failed_job):
    logs = _logs(store_client, failed_job)
    big = next(s for s in logs.sources(0) if s.attempt == 1 and s.stream == "stdout")
    with open(big.path, "ab") as fh:  # the rank kept printing: 50 MB more of its log
        line = b"x" * 99 + b"\n"
        fh.write(line * (50 * 10 ** 6 // len(line)))
    size = os.path.getsize(big.path)
    assert size > 50 * 10 ** 6
    length = 32 << 10
    status, body = _get(server, failed_job, ranks="0", length=length, failure=0)
    assert status == 200, body
    n_sources = len(logs.sources(0))
    assert body["sizes"]["0"][big.name] == size
    assert body["read"]["0"] <= n_sources * length and body["bytes_read"] <= n_sources * length
    assert body["more"] is True
    # paging on with the cursor reads the next range of that file, still bounded
    cur = lt.decode_log_cursor(body["cursor"])
    at = cur[big.key]
    assert 0 < at <= length
    status, nxt = _get(server, failed_job, ranks="0", length=length, failure=0, cursor=body["cursor"])
    assert nxt["read"]["0"] <= length and lt.decode_log_cursor(nxt["cursor"])[big.key] > at
    # the tail: the last bytes only
    status, tail = _get(server, failed_job, ranks="0", length=length, failure=0, tail=1)
    assert tail["read"]["0"] <= n_sources * length
    assert lt.decode_log_cursor(tail["cursor"])[big.key] == size
    # a search scans at most `scan` bytes per request and says where to go on
    status, s = _get(server, failed_job, ranks="0", q="no such text", scan=1 << 20)
    assert status == 200 and s["scanned"] <= 1 << 20 and s["done"] is False and s["matches"] == []
    # the first failure, found with the 50 MB log present, reads only bounded tails
    status, body = _get(server, failed_job, ranks="0,1", length=length, tail=1)
    assert body["first_failure"]["rank"] == 1 and body["bytes_read"] < 2 * 8 * (lt.DEFAULT_LENGTH + (64 << 10))


def test_rest_search_continues_with_its_cursor(server, store_client, failed_job):
    logs = _logs(store_client, failed_job)
    want = []
    for s in logs.sources(1):
        data = open(s.path, "rb").read()
        for ln in lt.split_lines(data, 0, True, True)[0]:
            if "world 2" in ln.text:
                want.append((s.name, ln.offset, ln.text))
    assert len(want) > 8
    got, cursor, pages = [], None, 0
    while True:
        status, body = _get(server, failed_job, ranks="1", q="WORLD 2", limit=4, cursor=cursor)
        assert status == 200, body
        assert len(body["matches"]) <= 4
        got.extend((m["source"], m["offset"], m["text"]) for m in body["matches"])
        cursor, pages = body["cursor"], pages + 1
        if body["done"]:
            break
        assert pages < 50
    assert got == want and pages >= 3
    status, body = _get(server, failed_job, ranks="1", q=r"^step \d+ world 2$", regex=1, limit=1000)
    assert [m["text"] for m in body["matches"]] == [t for _, _, t in want]


def test_rest_follow_mode_gets_only_new_lines(server, store_client):
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local", "--procs-per-node", "2", "--name", "follow",
                      "--", "--steps", "25", "--sleep", "0.2"], client=store_client)
    job = Follow(store_client, job_id)
    job.until(lambda: job.kinds("step"), "the first step")
    seen: dict[tuple, str] = {}
    cursor, polls, new_each = None, 0, []
    while True:
        done = bool(job.kinds("finished") or job.kinds("job.failed"))
        status, body = _get(server, job_id, cursor=cursor, failure=0, tail=1 if cursor is None else None)
        assert status == 200, body
        fresh = 0
        for ln in body["lines"]:
            for r, off in ln["offsets"].items():
                key = (r, ln["sources"][r], off)
                assert key not in seen, f"line {key} {ln['text']!r} came twice"
                seen[key] = ln["text"]
                fresh += 1
        new_each.append(fresh)
        cursor, polls = body["cursor"], polls + 1
        if done:
            break
        job.events.extend(job.reader.poll())
        time.sleep(0.5)
    status, body = _get(server, job_id, cursor=cursor, failure=0)
    assert body["lines"] == [] and body["bytes_read"] == 0  # nothing new: nothing read
    texts = [t for (r, _, _), t in seen.items() if r == "0"]
    assert [f"step {i} world 2" for i in range(25)] == [t for t in texts if t.startswith("step ") and "world" in t]
    assert polls >= 3 and sum(1 for n in new_each if n) >= 2, new_each
    assert "done" in texts


# ---------------------------------------------------------------------------- (c) Slurm
def test_triage_over_ssh_finds_the_failing_rank_on_slurm(dev_cluster, client):
    job_id = _run_failing_job(client, "local-slurm", ["--nodes", "2", "--procs-per-node", "1", "--max-retries", "0",
                                                         "--no-auto-resume"], steps=300,
                              timeout=400)
    rec = client.get(job_id)
    sched = client.scheduler(rec.cluster)
    assert type(sched.remote).__name__ != "LocalFiles"
    reply = lt.triage(client, job_id, tail=False)
    f = reply["first_failure"]
    assert f["rank"] == 1 and "InjectedFault" in f["exception"], f
    assert f["node"] == sched.rank_info(rec, 1)["node"]
    data = sched.remote.read_from(os.path.join(rec.job_dir, f["source"]), f["offset"], len(TB))
    assert data == TB
    assert any(ln["text"] == "loading data..." and ln["ranks"] == [0, 1] for ln in reply["lines"])
    assert reply["bytes_read"] < 1 << 20


def test_a_killed_rank_has_no_traceback_and_its_last_lines_are_shown(store_client):
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local", "--procs-per-node", "2", "--name", "triage-kill",
                      "--max-retries", "0", "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                      "--", "--steps", "300", "--sleep", "0.1"], client=store_client)
    job = Follow(store_client, job_id)
    job.until(lambda: any(e.data["step"] >= 3 for e in job.kinds("step")), "step 3")
    store_client.inject_fault(job_id, 1, kind="kill")
    job.until(lambda: job.kinds("fault.detected", rank=1), "rank 1's fault.detected")
    job.until(lambda: _over(store_client, job_id), "the end")
    reply = lt.triage(store_client, job_id, around_traceback=True, ranks=[1])
    f = reply["first_failure"]
    assert f["rank"] == 1 and f["found_by"] == "event" and f["offset"] is None and "SIGKILL" in f["exception"], f
    # no traceback to show: the rank's last lines instead
    texts = [ln["text"] for ln in reply["lines"]]
    assert reply["ranks"] == [1] and "rank 1 says hello" in texts and any(t.startswith("step ") for t in texts)
    assert all(ln["ranks"] == [1] for ln in reply["lines"])
    # without events: triage reports the root cause torchelastic's ChildFailedError report in the
    # job's own log names. That is its earliest failure by timestamp: rank 1's SIGKILL as the agent
    # saw it, or, a race seen once in a fresh-clone run (fresh16), rank 0's error when rank 0 hit its
    # next collective first; the events (above) name rank 1 either way
    logs = _logs(store_client, job_id)
    f = lt.first_failure(logs, [0, 1], None)
    assert f["rank"] in (0, 1) and f["found_by"] == "log" and f["source"] == lt.JOB_LOG and f["kind"] == "childfailed", f
    if f["rank"] == 1:
        assert "SIGKILL" in f["exception"] and "rank 1" in f["exception"], f["exception"]
    job_log = logs.read_job_log(0, 10 ** 7).raw
    assert job_log[f["offset"]:].startswith(b"ChildFailedError") and b"Root Cause" in job_log[f["offset"]:f["end"]]
    win = lt.around(logs, f, 8192)
    assert any(ln["text"].startswith("Root Cause (first observed failure)") for ln in win["lines"]), win["lines"]
