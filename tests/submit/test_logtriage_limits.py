"""Log triage's limits (issue 24, findings 1 and 2), on real files through the real ``local`` scheduler.

Reproduced on the code before the fix:

* search patterns ran on Python's ``re`` behind a guard that looked only at innermost groups:
  ``((\\w+\\s?))+$`` took seconds on a 24-character line (doubling per character) and
  ``\\s*\\s*\\s*\\s*\\s*x`` minutes on a line of spaces; lookaround and backreferences were
  accepted or refused with a message that did not name them;
* a view read up to ``length`` (1 MiB) of each of up to 512 sources with no total: one request
  over short-line logs held hundreds of MiB to GiB (every line a Python object); the traceback
  window and a search's 1 MiB chunks did the same for one source.

The job directories here are laid out as torchrun writes them (``logs/torchrun/<run>/attempt_K/
<local rank>/{stdout,stderr}.log`` and the ranks' ``ranks/rank-R.json``) and read through the real
local scheduler; no job runs (the server test, tests/server/test_logtriage_redos.py, runs one).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import pytest

from hyperpod_lab.errors import SpecError
from hyperpod_lab.submit import logtriage as lt
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobRecord, JobStore

MiB = 1 << 20


def _job(tmp_path, per_rank: dict[int, dict[str, bytes]], name: str = "job") -> lt.RankLogs:
    """A job directory with each rank's attempt-0 ``stdout.log``/``stderr.log`` as given, read
    through the local scheduler."""
    job_dir = tmp_path / name
    (job_dir / "ranks").mkdir(parents=True)
    for r, files in per_rank.items():
        slot = job_dir / "logs" / "torchrun" / "run1" / "attempt_0" / str(r)
        slot.mkdir(parents=True)
        for stream in ("stdout", "stderr"):
            (slot / f"{stream}.log").write_bytes(files.get(stream, b""))
        (job_dir / "ranks" / f"rank-{r}.json").write_text(json.dumps({"log_file": str(slot / "stdout.log"),
                                                                      "node": "n0"}))
    sched = Client(JobStore()).scheduler("local")
    rec = JobRecord(name, name, "local", "local", "0", str(job_dir), {}, status="failed")
    return lt.RankLogs(sched, rec)


def _short_lines(rank: int, size: int) -> bytes:
    """~``size`` bytes of distinct short lines (7-8 bytes each: nothing collapses)."""
    out, i, n = [], 0, 0
    while n < size:
        line = b"%d\n" % (rank * 10 ** 6 + i)
        out.append(line)
        n, i = n + len(line), i + 1
    return b"".join(out)


# ---------------------------------------------------------------------------- finding 1: ReDoS
EVIL = [(r"((\w+\s?))+$", "a" * 24 + "!"),  # 2.2 s on Python's re (the machine), x2 per character
        (r"\s*\s*\s*\s*\s*x", " " * 4000),  # > 30 s on Python's re
        (r"(a+)+$", "a" * 4000 + "!"),
        (r"(a|aa)*c", "a" * 4000),
        (r"(x*y?)*z", "x" * 4000)]


def test_evil_patterns_match_in_linear_time():
    """Each pattern over its line (and over a 4096-character line, the longest kept) in a child
    process, so a backtracking engine cannot hold this test: all of them within 2 s together."""
    code = ("import sys, time, json; from hyperpod_lab.submit import logtriage as lt\n"
            "cases = json.loads(sys.argv[1]); out = []\n"
            "for q, line in cases:\n"
            "    m = lt.compile_query(q, True); t = time.perf_counter()\n"
            "    for _ in range(10): m(line); m(line * (4096 // len(line)))\n"
            "    out.append(time.perf_counter() - t)\n"
            "print(json.dumps(out))\n")
    try:
        res = subprocess.run([sys.executable, "-c", code, json.dumps(EVIL)], capture_output=True, text=True,
                             timeout=20)
    except subprocess.TimeoutExpired:
        res = None
    assert res is not None, "the evil patterns took over 20 s: the search engine backtracks (catastrophic backtracking)"
    assert res.returncode == 0, res.stderr
    times = json.loads(res.stdout)
    assert sum(times) < 2.0, dict(zip([q for q, _ in EVIL], times))


def test_regular_expressions_still_find_lines():
    m = lt.compile_query(r"step \d+ (?:loss|lr)=[0-9.]+$", True)
    assert m("step 12 loss=0.25") and not m("step x loss=0.25")
    assert lt.compile_query(r"(?i)nccl.*timeout", True)("NCCL watchdog: Timeout after 600 s")
    assert not lt.compile_query(r"NCCL", True)("nccl")  # case-sensitive unless (?i)
    assert lt.compile_query(r"((\w+\s?))+$", True)("done")
    assert lt.compile_query("Error", False)("a RuntimeError: x")  # substrings: case-insensitive


@pytest.mark.parametrize("q, construct", [
    (r"(a)\1", "backreference"), (r"(?P<x>a)(?P=x)", "backreference"), (r"error(?=: rank)", "lookahead"),
    (r"x(?!y)", "negative lookahead"), (r"(?<=rank )\d", "lookbehind"), (r"(?<!warn)ing", "negative lookbehind"),
    (r"(?>a+)b", "atomic group"), (r"a++b", "possessive")])
def test_what_re2_cannot_run_is_refused_naming_the_construct_and_the_fix(q, construct):
    with pytest.raises(SpecError) as e:
        lt.compile_query(q, True)
    msg = str(e.value)
    assert e.value.field == "q" and construct in msg, msg
    assert "plain substring" in msg and "RE2-compatible pattern" in msg, msg


def test_an_invalid_pattern_says_why_and_an_escaped_backslash_is_no_backreference():
    with pytest.raises(SpecError) as e:
        lt.compile_query("(unclosed", True)
    assert "missing )" in str(e.value) and "backreference" not in str(e.value), str(e.value)
    assert lt.compile_query(r"C:\\1", True)(r"path C:\1")  # a backslash, then 1


def test_the_old_heuristic_guard_is_gone():
    from hyperpod_lab.submit.logtriage import parse

    assert not hasattr(lt, "NESTED_REPEAT") and not hasattr(parse, "NESTED_REPEAT")


# ---------------------------------------------------------------------------- finding 2: budgets
def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("ranks", [1, 8, 64])
def test_one_view_request_is_bounded_whatever_the_rank_count(tmp_path, ranks):
    """1 MiB of short distinct lines per rank, read with the largest ``length``: the request
    reads at most VIEW_BYTES, keeps at most VIEW_LINES lines and says it was cut (before the fix:
    8 sources of 1 MiB held ~1 GiB)."""
    logs = _job(tmp_path, {r: {"stdout": _short_lines(r, MiB)} for r in range(ranks)})
    view, peak = _peak(lambda: lt.read_view(logs, logs.ranks(), {}, 1 << 20, False, True))
    assert peak < 48 * MiB, f"one view request peaked at {peak / MiB:.0f} MiB of Python memory"
    assert logs.bytes_read <= 8 * MiB and sum(len(ln["ranks"]) for ln in view["lines"]) <= 20_000
    assert logs.bytes_read <= lt.VIEW_BYTES
    assert sum(len(ln["ranks"]) for ln in view["lines"]) <= lt.VIEW_LINES
    assert view["truncated"] is True and view["more"] is True
    assert view["budget"] == {"bytes": lt.VIEW_BYTES, "lines": lt.VIEW_LINES}
    assert set(view["read"]) == set(range(ranks))  # every rank got its share


def test_a_view_within_budget_is_not_truncated(tmp_path):
    logs = _job(tmp_path, {0: {"stdout": b"hello\nworld\n"}, 1: {"stdout": b"hello\n"}})
    view = lt.read_view(logs, [0, 1], {}, lt.DEFAULT_LENGTH, False, True)
    assert view["truncated"] is False and view["more"] is False
    assert [(ln["text"], ln["ranks"]) for ln in view["lines"]] == [("hello", [0, 1]), ("world", [0])]


def test_paging_a_cut_view_with_its_cursor_shows_every_line_once(tmp_path):
    data = {r: {"stdout": _short_lines(r, 20_000)} for r in range(4)}
    logs = _job(tmp_path, data)
    seen: list[tuple[int, int]] = []
    cursor: dict = {}
    for _ in range(50):
        view = lt.read_view(logs, [0, 1, 2, 3], cursor, lt.MAX_LENGTH, False, True, max_bytes=16 << 10,
                            max_lines=1000)
        assert sum(len(ln["ranks"]) for ln in view["lines"]) <= 1000 and logs.bytes_read <= 50 * (16 << 10)
        seen += [(r, off) for ln in view["lines"] for r, off in ln["offsets"].items()]
        cursor = view["cursor"]
        if not view["more"]:
            break
    assert not view["more"]
    want = [(r, i) for r in range(4) for i in range(len(data[r]["stdout"])) if i == 0 or data[r]["stdout"][i - 1] == 10]
    assert sorted(seen) == want  # each line once, none missed


def test_a_cut_tail_keeps_the_last_lines(tmp_path):
    body = _short_lines(0, MiB)
    logs = _job(tmp_path, {0: {"stdout": body}})
    view = lt.read_view(logs, [0], {}, lt.MAX_LENGTH, True, True)
    texts = [ln["text"] for ln in view["lines"]]
    assert len(texts) == lt.VIEW_LINES and view["truncated"] is True
    assert texts == body.decode().splitlines()[-lt.VIEW_LINES:]
    assert lt.decode_log_cursor(lt.encode_cursor(view["cursor"]))["0:logs/torchrun/run1/attempt_0/0/stdout.log"] == len(body)


def test_the_traceback_window_is_bounded_and_keeps_the_traceback(tmp_path):
    tb = b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nRuntimeError: boom\n"
    err = b"\n" * (600 << 10) + tb + b"\n" * 10_000  # a rank printing empty lines around its failure
    logs = _job(tmp_path, {0: {"stderr": err}})
    f = lt.first_failure(logs, [0], None, lt.MAX_LENGTH)
    assert f["offset"] == 600 << 10 and f["exception"] == "RuntimeError: boom"
    win, peak = _peak(lambda: lt.around(logs, f, 1 << 20))
    assert peak < 32 * MiB and len(win["lines"]) <= 20_000, (f"the traceback window peaked at {peak / MiB:.0f} MiB, "
                                                             f"{len(win['lines'])} lines")
    assert len(win["lines"]) <= lt.VIEW_LINES and win["truncated"] is True
    assert any(ln["text"].startswith("Traceback") and ln["offsets"][0] == f["offset"] for ln in win["lines"])
    assert any(ln["text"] == "RuntimeError: boom" for ln in win["lines"])


def test_finding_the_first_failure_reads_a_bounded_total(tmp_path):
    tb = b"Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: rank %d\n"
    logs = _job(tmp_path, {r: {"stderr": _short_lines(r, MiB) + tb % r} for r in range(20)})
    f, peak = _peak(lambda: lt.first_failure(logs, logs.ranks(), None, 1 << 20))
    assert f is not None and f["exception"] == "ValueError: rank 0", f
    assert logs.bytes_read <= 16 * MiB + 20 * (64 << 10), logs.bytes_read  # + the error.json files it may read
    assert logs.bytes_read <= lt.FAILURE_BYTES + 20 * (64 << 10)
    assert peak < 48 * MiB, f"finding the first failure peaked at {peak / MiB:.0f} MiB"


def test_a_search_holds_one_line_at_a_time(tmp_path):
    logs = _job(tmp_path, {0: {"stdout": b"\n" * MiB + b"needle\n"}, 1: {"stdout": b"needle\n"}})
    res, peak = _peak(lambda: lt.search(logs, [0, 1], "needle", scan=8 * MiB))
    assert [m["rank"] for m in res["matches"]] == [0, 1] and res["done"] is True
    assert peak < 16 * MiB, f"a search peaked at {peak / MiB:.0f} MiB (every line of a 1 MiB chunk at once?)"
