"""Per-rank log triage: all ranks' logs in one view, by byte range (issue 18, item 3).

Torch-free and without Jupyter imports: the REST route (``hyperpod_lab.server.handlers.logtriage``),
the CLI (``hyperpod-lab logs JOB --triage``) and the tests use it alike.

Where a rank's output is
    torchrun (``--log-dir <job>/logs/torchrun --tee 3``) writes each worker's output to
    ``<run>/attempt_<k>/<local_rank>/{stdout,stderr}.log``; a restart is a new attempt. The
    rank's ``ranks/rank-R.json`` names its current attempt's ``stdout.log`` (``log_file``); the
    rank's *sources* are every attempt's ``stdout.log`` and ``stderr.log`` of that worker slot
    (a Python traceback goes to ``stderr.log`` of the attempt that failed). A backend without
    that layout (EKS pods, a rank that recorded no file) has one source, the scheduler's own
    :meth:`~hyperpod_lab.schedulers.base.Scheduler.log_range` of the rank, named ``log``.

Everything by byte range
    Every read is one :func:`~hyperpod_lab.schedulers.base.read_log_range` (or ``log_range``)
    of at most the requested length: never the whole file. A *cursor* is ``{"R:source": byte
    offset}`` per rank and source; :func:`~hyperpod_lab.events.encode_cursor` makes the opaque
    string clients send back (:func:`decode_log_cursor` reads it).

Terms: rank (global rank of the worker), node (host it ran on), attempt (torchrun's restart
count, 0 first), source (one log file of a rank), offset (bytes from the start of a source).
"""

from __future__ import annotations

import re
from collections import deque
from itertools import islice
from typing import Callable, Iterable

import re2

from hyperpod_lab.errors import HyperPodLabError, SpecError
from hyperpod_lab.events import decode_cursor, encode_cursor
from hyperpod_lab.schedulers.base import LogChunk
from hyperpod_lab.submit.logtriage.parse import (
    DEFAULT_LENGTH,
    DEFAULT_SCAN,
    FAILURE_BYTES,
    FAILURE_LINES,
    LOG_CURSOR_KEY,
    MAX_LENGTH,
    MAX_MATCHES,
    MAX_PATTERN,
    MAX_RANKS,
    MAX_SCAN,
    MAX_SOURCES,
    VIEW_BYTES,
    VIEW_LINES,
    Line,
    Traceback,
    collapse,
    find_tracebacks,
    iter_lines,
    last_lines,
    split_lines,
    strip_prefix,
)
from hyperpod_lab.submit.logtriage.select import (
    FAULT_EVENT_BYTES,
    MAX_FAILING,
    SAMPLE_HEALTHY,
    SMALL_EVENT_FILE,
    cursor_ranks,
    failing_ranks,
    fault_order,
    fault_ranks,
    faults_from_aggregate,
    healthy_sample,
    read_fault_events,
    view_ranks,
)
from hyperpod_lab.submit.logtriage.sources import RankLogs, Source, raw_bytes

__all__ = ["DEFAULT_LENGTH", "DEFAULT_SCAN", "FAILURE_BYTES", "FAILURE_LINES", "MAX_LENGTH", "MAX_MATCHES", "MAX_SCAN",
           "VIEW_BYTES", "VIEW_LINES", "JOB_LOG", "FAULT_EVENT_BYTES", "MAX_FAILING", "SAMPLE_HEALTHY", "SMALL_EVENT_FILE",
           "SEARCH_RANKS", "SMALL_JOB", "failing_ranks", "faults_from_aggregate", "healthy_sample", "Line", "RankLogs", "Source", "Traceback", "collapse", "find_tracebacks", "split_lines", "strip_prefix", "around", "compile_query", "decode_log_cursor", "first_failure", "format_matches", "format_view", "rank_badge", "parse_ranks", "rank_set_label", "read_fault_events", "read_view", "search", "triage"]


def decode_log_cursor(text: str | None, name: str = "cursor") -> dict[str, int]:
    """A log cursor (``{"R:source": byte offset}``, made by :func:`~hyperpod_lab.events.encode_cursor`)
    read back by :func:`~hyperpod_lab.events.decode_cursor`; None or "" is no cursor. Its keys only
    select offsets of the sources a request lists itself (a key naming no source is ignored, never
    opened). Raises SpecError(``name``)."""
    return decode_cursor(text, field=name, key=LOG_CURSOR_KEY, max_chars=65536, max_offset=1 << 62,
                         error="is not a log cursor this server issued; omit it to start again")


def parse_ranks(text: str | None, known: list[int] | None = None) -> list[int] | None:
    """``"0,2,4-7"`` as a sorted list of ranks (None or "" is None: every rank). Raises
    SpecError("ranks") for anything else, or more than :data:`MAX_RANKS` ranks."""
    if text is None or not text.strip():
        return None
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,7})\s*(?:-\s*(\d{1,7})\s*)?", part)
        if not m:
            raise SpecError("ranks", f"must be ranks and ranges like 0,2,4-7, got {text[:80]!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi - lo >= MAX_RANKS or len(out) + hi - lo + 1 > MAX_RANKS:
            raise SpecError("ranks", f"names more than {MAX_RANKS} ranks or an empty range ({part.strip()!r})")
        out.update(range(lo, hi + 1))
    return sorted(out)


def rank_set_label(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3,5"`` (the badge of a collapsed line)."""
    rs = sorted(set(ranks))
    parts, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def read_view(logs: RankLogs, ranks: list[int], cursor: dict[str, int], length: int, tail: bool,
              at_eof: bool, max_bytes: int = VIEW_BYTES, max_lines: int = VIEW_LINES) -> dict:
    """The collapsed view of ``ranks``' logs from ``cursor`` (or, for a source the cursor does
    not name, its first bytes, or with ``tail`` its last ``length`` bytes).

    Reads at most ``length`` bytes of each source (bytes), and at most ``max_bytes`` bytes and
    ``max_lines`` lines of all sources together (:data:`VIEW_BYTES`, :data:`VIEW_LINES`: what
    one request holds in memory, whatever the number of ranks): each source gets an equal share
    of what is left, so every rank shows. Where the budget cut a source (fewer bytes than
    ``length``, or fewer lines than were read), ``truncated`` is true: the cursor goes on from
    the last line shown (a tail keeps the last lines); narrow the ranks to see more at once.
    Lines are collapsed per attempt and stream (the same attempt's ``stdout`` of every rank
    together), groups in attempt order.

    Returns ``{"lines": [{"text", "ranks", "count" (how many ranks printed it: ``len(ranks)``),
    "offsets": {R: byte}, "attempt", "stream", "sources": {R: name}}], "cursor": {key: offset} (where the next read of each source starts:
    follow mode asks again with it and gets only new lines), "sizes": {R: {name: bytes}},
    "read": {R: bytes read}, "more": whether some source has bytes past the cursor,
    "truncated": whether the request's budget cut the view, "budget": {"bytes", "lines"}}``.
    """
    groups: dict[tuple, dict[int, list[Line]]] = {}
    names: dict[tuple, dict[int, str]] = {}
    next_cur = dict(cursor)
    sizes: dict[int, dict[str, int | None]] = {}
    read: dict[int, int] = {}
    more = truncated = False
    todo: list[tuple[int, Source, int | None]] = []
    count = 0
    for r in ranks:
        if count >= MAX_SOURCES:
            more = True
            break
        for src in logs.sources(r):
            count += 1
            if count > MAX_SOURCES:
                more = True
                break
            start = cursor.get(src.key)
            if start is None and not tail:
                start = 0
            if src.size is not None and (start or 0) >= src.size:  # nothing new (or an empty file)
                sizes.setdefault(r, {})[src.name] = src.size
                next_cur[src.key] = start if start is not None else src.size
                read.setdefault(r, 0)
                continue
            todo.append((r, src, start))
    # the smallest first: what a small source leaves of its share goes to the bigger ones
    todo.sort(key=lambda t: (t[1].size is None, (t[1].size or 0) - (t[2] or 0)))
    bytes_left, lines_left = max_bytes, max_lines
    for i, (r, src, start) in enumerate(todo):
        want = min(length, bytes_left // (len(todo) - i))  # an equal share of what is left
        cap = lines_left // (len(todo) - i)
        read.setdefault(r, 0)
        if want <= 0 or cap <= 0:
            truncated = more = True
            continue
        chunk = logs.read(src, start, want)
        data = raw_bytes(chunk)
        bytes_left -= len(data)
        read[r] += len(data)
        sizes.setdefault(r, {})[src.name] = chunk.size
        eof = chunk.size is not None and chunk.end >= chunk.size
        full = len(data) >= want
        if start is None and chunk.offset > 0:  # a tail: its first line is likely cut; the last lines
            lines, nxt, cut = last_lines(data, chunk.offset, at_eof and eof, full, cap)
            short = True  # bytes before the tail are left out anyway
        else:
            it = iter_lines(data, chunk.offset, at_eof and eof, full)
            lines = list(islice(it, cap))
            cut = next(it, None) is not None
            nxt = lines[-1].end if lines else chunk.offset
            short = not eof
        if cut or (want < length and full and short):
            truncated = True
        lines_left -= len(lines)
        next_cur[src.key] = nxt
        if chunk.size is not None and nxt < chunk.size:
            more = True
        gk = (src.attempt if src.attempt is not None else -1, {"stdout": 0, "stderr": 1}.get(src.stream, 2),
              src.stream)
        if lines:
            groups.setdefault(gk, {})[r] = lines
            names.setdefault(gk, {})[r] = src.name
    out = []
    for gk in sorted(groups):
        for entry in collapse(groups[gk]):
            entry["count"] = len(entry["ranks"])
            entry["attempt"] = None if gk[0] < 0 else gk[0]
            entry["stream"] = gk[2]
            entry["sources"] = {r: names[gk][r] for r in entry["ranks"]}
            out.append(entry)
    return {"lines": out, "cursor": next_cur, "sizes": sizes, "read": read, "more": more,
            "truncated": truncated, "budget": {"bytes": max_bytes, "lines": max_lines}}


def first_failure(logs: RankLogs, ranks: list[int], faults: list[dict] | None = None, length: int = DEFAULT_LENGTH,
                  near_time: float | None = None) -> dict | None:
    """The first failing rank and its traceback.

    Which rank: of the ``fault.detected`` events (``faults``: the events' dicts, with ``time``
    and ``data.rank``), those whose reason is not a consequence of another rank's failure (a
    peer's "connection closed by peer", a SIGTERM: each node's agent marks its own root cause,
    and by error-file age, so a consequence can carry ``root_cause``) first, then those marked
    ``root_cause``, then the earliest; without
    events, the earliest failure torchrun recorded (``error.json`` timestamps), else the earliest
    traceback in attempt order that is not a consequence of another rank's failure
    (:attr:`Traceback.secondary`), ties to the lowest rank; when the ranks' logs hold no such
    traceback (a SIGKILL leaves none), the root cause of torchelastic's ``ChildFailedError``
    report in the tail of the whole job's log (``source`` :data:`JOB_LOG`). Only ``ranks`` are
    considered.

    Which traceback of that rank: with ``near_time`` (seconds since the epoch, e.g. the
    ``fault.detected`` event's time), the attempt whose recorded failure time is nearest;
    else the event's reason matched against the exception lines; else the first attempt with one.

    Reads the last ``length`` bytes of each ``stderr`` (else ``stdout``/``log``) source of the
    ranks it looks at, at most :data:`FAILURE_BYTES` bytes of them all together, and searches
    at most :data:`FAILURE_LINES` lines of them all together (each source an equal share of
    what is left: the last lines of its tail); torchrun's ``error.json`` files (64 KiB at most
    each, of the sources with a traceback); without a root cause there, the last ``length``
    bytes (and :data:`FAILURE_LINES` lines) of the whole job's log.

    Returns ``{"rank", "node", "source", "attempt", "offset", "end", "exception",
    "exception_offset", "traceback_text", "kind", "time", "found_by"}`` (offsets in bytes of
    ``source``; ``found_by`` is ``event``, ``error_file`` or ``log``), or None when no rank failed
    or its log holds no traceback.
    """
    wanted = set(ranks)
    event, event_rank = None, None
    # each node's agent names its own root cause: a peer's "connection closed" is a consequence
    # (the agent's root_cause is its own guess by error-file age; seen wrong within a second)
    for ev in sorted(faults or [], key=fault_order):
        r = next((x for x in fault_ranks(ev) if x in wanted), None)
        if r is not None:
            event, event_rank = ev, r
            break

    def looked_at(r: int) -> list[Source]:
        srcs = logs.sources(r)
        return [s for s in srcs if s.stream == "stderr"] or srcs

    budget = {"bytes": FAILURE_BYTES, "lines": FAILURE_LINES, "sources": 0}  # left for the sources left

    def tracebacks(r: int) -> list[tuple[Source, Traceback, float | None]]:
        found = []
        for src in looked_at(r):
            share = max(1, budget["sources"])
            want, cap = min(length, budget["bytes"] // share), budget["lines"] // share
            budget["sources"] = max(0, budget["sources"] - 1)
            if want <= 0 or cap <= 0:
                continue
            chunk = logs.read(src, None, want)
            data = raw_bytes(chunk)
            lines = _tail_lines(data, chunk.offset, cap)
            budget["bytes"] -= len(data)
            budget["lines"] -= len(lines)
            tbs = find_tracebacks(lines)
            if tbs:
                t = logs.error_time(src)
                found.extend((src, tb, t) for tb in tbs)
        return found

    def pick(cands, reason: str | None, when: float | None):
        if not cands:
            return None
        if when is not None and any(t is not None for _, _, t in cands):
            return min(cands, key=lambda c: (abs((c[2] if c[2] is not None else 1e18) - when), c[1].secondary))
        if reason:
            msg = reason.split(": ", 1)[-1][:80]
            hit = [c for c in cands if msg and msg in c[1].exception]
            if hit:
                return hit[0]
        primary = [c for c in cands if not c[1].secondary]
        return (primary or cands)[0]

    if event is not None:
        r = event_rank
        budget["sources"] = len(looked_at(r))
        c = pick(tracebacks(r), (event.get("data") or {}).get("reason"), near_time)
        found_by, when, node = "event", event.get("time"), (event.get("data") or {}).get("node") or logs.node(r)
        if c is None:
            return {"rank": r, "node": node, "source": None, "attempt": None, "offset": None, "end": None,
                    "exception": (event.get("data") or {}).get("reason"), "exception_offset": None,
                    "traceback_text": None, "kind": None, "time": when, "found_by": found_by}
    else:
        every = []
        budget["sources"] = sum(len(looked_at(r)) for r in ranks[:MAX_RANKS])
        for r in ranks[:MAX_RANKS]:
            every.extend((r, *c) for c in tracebacks(r))
        if not any(not c[2].secondary for c in every):
            # no root cause in the ranks' logs (a SIGKILL leaves no traceback; its peers' are
            # consequences): torchelastic's report in the job's log names the first failure
            found = _job_log_failure(logs, wanted, length)
            if found is not None or not every:
                return found
        if near_time is not None:
            best = min(every, key=lambda c: (abs((c[3] if c[3] is not None else 1e18) - near_time), c[0]))
        elif any(c[3] is not None for c in every):
            best = min((c for c in every if c[3] is not None), key=lambda c: (c[3], c[2].secondary, c[0]))
        else:
            best = min(every, key=lambda c: (c[1].attempt if c[1].attempt is not None else -1, c[2].secondary, c[0]))
        r, c = best[0], best[1:]
        found_by = "error_file" if c[2] is not None else "log"
        when, node = c[2], logs.node(r)
    src, tb, t = c
    return {"rank": r, "node": node, "source": src.name, "attempt": src.attempt, "offset": tb.offset, "end": tb.end,
            "exception": tb.exception, "exception_offset": tb.exception_offset, "traceback_text": tb.text,
            "kind": tb.kind, "time": when if when is not None else t, "found_by": found_by}


JOB_LOG = "job log"  #: ``source`` of a failure found in the whole job's log


def _tail_lines(data: bytes, base: int, max_lines: int) -> list[Line]:
    """The last ``max_lines`` lines of ``data`` (read from byte ``base``; its last line kept
    without its newline), split without building the lines before them."""
    p = len(data)
    for _ in range(max_lines + 1):
        p = data.rfind(b"\n", 0, p)
        if p < 0:
            return split_lines(data, base, True, True)[0][-max_lines:]
    return split_lines(data[p + 1:], base + p + 1, True, True)[0][-max_lines:]


def _job_log_failure(logs: RankLogs, wanted: set[int], length: int) -> dict | None:
    """The root cause of the last ``ChildFailedError`` report in the tail (``length`` bytes) of
    the whole job's log, when it names one of ``wanted``: how a rank that died without a
    traceback (SIGKILL) is found without events. None otherwise."""
    try:
        chunk = logs.read_job_log(None, length)
    except (OSError, HyperPodLabError):
        return None
    lines = _tail_lines(raw_bytes(chunk), chunk.offset, FAILURE_LINES)
    reports = [tb for tb in find_tracebacks(lines) if tb.kind == "childfailed" and tb.rank in wanted]
    if not reports:
        return None
    tb = reports[-1]
    return {"rank": tb.rank, "node": logs.node(tb.rank) or tb.host, "source": JOB_LOG, "attempt": None,
            "offset": tb.offset, "end": tb.end, "exception": tb.exception, "exception_offset": tb.exception_offset,
            "traceback_text": tb.text, "kind": tb.kind, "time": None, "found_by": "log"}


def around(logs: RankLogs, failure: dict, length: int, max_lines: int = VIEW_LINES) -> dict:
    """The lines of the failing rank's source around its traceback: ``length`` bytes (at most
    :data:`VIEW_BYTES`) starting a quarter of ``length`` before the traceback (so the lines
    leading to it show too), at most ``max_lines`` lines (:data:`VIEW_LINES`: a quarter of them
    before the traceback, the rest from it on; ``truncated`` says when lines were left out).
    Returns the :func:`read_view` shape for that one source (``lines`` not collapsed: one rank)."""
    r = failure["rank"]
    budget = {"bytes": VIEW_BYTES, "lines": max_lines}
    if failure.get("source") == JOB_LOG:  # a ChildFailedError report in the whole job's log
        src: Source | None = Source(r, JOB_LOG, None, "log", None)
        read: Callable[[int, int], LogChunk] = logs.read_job_log
    else:
        src = next((s for s in logs.sources(r) if s.name == failure.get("source")), None)
        read = lambda off, n: logs.read(src, off, n)  # noqa: E731
    if src is None or failure.get("offset") is None:
        return {"lines": [], "cursor": {}, "sizes": {}, "read": {r: 0}, "more": False, "truncated": False,
                "budget": budget}
    length = min(length, VIEW_BYTES)
    start = max(0, failure["offset"] - length // 4)
    chunk = read(start, length)
    data = raw_bytes(chunk)
    it = iter_lines(data, chunk.offset, True, len(data) >= length)
    if start > 0 and raw_bytes(read(start - 1, 1)) != b"\n":
        next(it, None)  # the read started inside a line
    before: deque[Line] = deque(maxlen=max(1, max_lines // 4))  # the last lines before the traceback
    after: list[Line] = []
    cut = False
    for ln in it:
        if ln.end <= failure["offset"]:
            cut = cut or len(before) == before.maxlen
            before.append(ln)
            continue
        if len(before) + len(after) >= max_lines:
            cut = True
            break
        after.append(ln)
    lines = [*before, *after]
    nxt = lines[-1].end if lines else chunk.offset
    return {"lines": [{"text": ln.text, "ranks": [r], "count": 1, "offsets": {r: ln.offset}, "attempt": src.attempt,
                       "stream": src.stream, "sources": {r: src.name}} for ln in lines],
            "cursor": {src.key: nxt}, "sizes": {r: {src.name: chunk.size}}, "read": {r: len(data)},
            "more": chunk.size is not None and nxt < chunk.size, "truncated": cut, "budget": budget}


REGEX_MAX_MEM = 8 << 20  #: bytes RE2 may use for one search pattern (its compiled program and DFA cache)

# what RE2 refuses that Python's re knows: (how it is written, what it is), found in the pattern's text
_UNSUPPORTED = [(re.compile(p), what) for p, what in (
    (r"\\[1-9]", "a backreference (\\1)"),
    (r"\(\?P=", "a named backreference ((?P=name))"),
    (r"\\[gk]<", "a named backreference (\\g<name>)"),
    (r"\(\?=", "a lookahead ((?=...))"),
    (r"\(\?!", "a negative lookahead ((?!...))"),
    (r"\(\?<=", "a lookbehind ((?<=...))"),
    (r"\(\?<!", "a negative lookbehind ((?<!...))"),
    (r"\(\?>", "an atomic group ((?>...))"),
    (r"\(\?\(", "a conditional group ((?(1)...))"),
    (r"[*+?}]\+", "a possessive repetition (a++)"),
    (r"\\Z", "\\Z (the end of the text: use $)"),
)]


def _unsupported(q: str) -> str | None:
    """The construct of ``q`` RE2 does not support, in words, or None. Escaped characters
    (``\\\\1`` is a backslash and a 1) are skipped; ``q`` is at most :data:`MAX_PATTERN`
    characters and these patterns are linear."""
    plain = re.sub(r"\\\\", "  ", q)  # an escaped backslash is no escape
    for pat, what in _UNSUPPORTED:
        if pat.search(plain):
            return what
    return None


def compile_query(q: str, regex: bool) -> Callable[[str], object]:
    """A matcher for ``q``: a case-insensitive substring, or with ``regex`` a regular expression
    in RE2's syntax (Python's, less backreferences and lookaround; ``(?i)`` for case-insensitive),
    searched in each line (lines cut at :data:`MAX_LINE` characters).

    RE2 (``google-re2``) matches in time linear in the line, whatever the pattern: a pattern
    like ``((\\w+\\s?))+$`` or ``\\s*\\s*\\s*x`` costs microseconds per line, where Python's
    ``re`` backtracks for seconds to hours while holding the GIL (the whole server stops). The
    matcher returns a true value for a line that matches.

    Raises:
        SpecError("q"): empty, longer than :data:`MAX_PATTERN` characters, not a valid
        regular expression, a construct RE2 cannot run in linear time (the message names it:
        backreference, lookahead, lookbehind, atomic group, possessive repetition), or a pattern
        whose program needs more than :data:`REGEX_MAX_MEM` bytes.
    """
    if not q:
        raise SpecError("q", "is empty; give a substring (or a regular expression with regex=1)")
    if len(q) > MAX_PATTERN:
        raise SpecError("q", f"is {len(q)} characters; at most {MAX_PATTERN}")
    if regex:
        opts = re2.Options()
        opts.log_errors = False  # a user's bad pattern is a 400, not a line in the server's log
        opts.max_mem = REGEX_MAX_MEM
        try:
            pat = re2.compile(q, opts)
        except re2.error as e:
            why = e.args[0] if e.args else e
            why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
            what = _unsupported(q)
            if what is not None:
                raise SpecError("q", f"uses {what}, which log search does not support: it runs regular expressions "
                                     f"with RE2, in time linear in the line, without backreferences or lookaround "
                                     f"(RE2 says: {why}); use a plain substring (regex=0) or an RE2-compatible "
                                     f"pattern") from None
            raise SpecError("q", f"is not a valid regular expression for log search (RE2 says: {why}); fix it, or "
                                 f"use a plain substring (regex=0) or an RE2-compatible pattern") from None
        return pat.search
    low = q.lower()
    return lambda s: (s.lower().find(low) + 1) or None


SMALL_JOB = MAX_FAILING + SAMPLE_HEALTHY  #: a job of at most this many ranks: a view reads every rank
SEARCH_RANKS = 64  #: most ranks one search request visits (their sources listed and read); the cursor goes on


def search(logs: RankLogs, ranks: list[int], q: str, regex: bool = False, cursor: dict[str, int] | None = None,
           scan: int = DEFAULT_SCAN, limit: int = 200, chunk_bytes: int = 1 << 20,
           max_ranks: int = SEARCH_RANKS) -> dict:
    """Lines of ``ranks``' sources that match ``q`` (see :func:`compile_query`), scanning at most
    ``scan`` bytes in this call (reads of ``chunk_bytes``), sources in rank order and each from
    its ``cursor`` offset (0 where not named), at most ``limit`` matches and at most
    ``max_ranks`` ranks visited (:data:`SEARCH_RANKS`). Lines are split and matched one at a
    time (memory: one ``chunk_bytes`` read and the matches).

    A continued search starts at the highest rank its cursor names (the ranks before it were
    searched to their end, in rank order) without listing or reading the ranks before it, and
    the cursor it returns names only the rank it stopped in: whatever the rank count, a request
    opens the files of at most ``max_ranks`` ranks and the cursor stays small. Lines a rank
    before that one writes later are not searched by the continued search (search again).

    Returns ``{"matches": [{"rank", "source", "attempt", "stream", "offset", "text"}], "cursor":
    {key: offset} (send it back to continue where this call stopped), "scanned": bytes read,
    "done": True when every source was searched to its end, "truncated": not ``done``,
    "note": what cut it and how to go on (None when done)}``.
    """
    match = compile_query(q, regex)
    cur = dict(cursor or {})
    resume = max(cursor_ranks(cur), default=None)
    todo = [r for r in ranks if resume is None or r >= resume]
    matches: list[dict] = []
    scanned, done, visited, last = 0, True, 0, None
    for r in todo:
        if visited >= max_ranks:
            done = False
            break
        visited += 1
        last = r
        for src in logs.sources(r):
            pos = cur.get(src.key, 0)
            while True:
                if scanned >= scan or len(matches) >= limit:
                    done = False
                    break
                if src.size is not None and pos >= src.size:
                    break
                want = min(chunk_bytes, scan - scanned)
                chunk = logs.read(src, pos, want)
                data = raw_bytes(chunk)
                scanned += len(data)
                eof = chunk.size is None or chunk.end >= chunk.size
                nxt = chunk.offset
                for ln in iter_lines(data, chunk.offset, eof, len(data) >= want):  # one line at a time
                    if len(matches) >= limit:
                        break
                    if match(ln.text):
                        matches.append({"rank": r, "source": src.name, "attempt": src.attempt, "stream": src.stream,
                                        "offset": ln.offset, "text": ln.text})
                    nxt = ln.end
                if nxt <= pos:  # nothing complete read: the source ends here for now
                    break
                pos = nxt
                cur[src.key] = pos
                if eof:
                    break
            cur[src.key] = pos
            if not done:
                break
        if not done:
            break
    if last is not None:  # the ranks before the one it stopped in are done: their keys go
        cur = {k: v for k, v in cur.items() if int(k.split(":", 1)[0]) >= last} if not done else cur
    note = None
    if not done:
        why = (f"{limit} matches" if len(matches) >= limit else f"{scanned} bytes scanned, the scan bound"
               if scanned >= scan else f"{max_ranks} ranks visited")
        upto = f"rank {last}" if last is not None else "the first rank"
        note = (f"truncated at this request's bound ({why}), in {upto}: send the cursor to go on, or narrow the "
                f"search (ranks, a more specific q)")
    return {"matches": matches, "cursor": cur, "scanned": scanned, "done": done, "truncated": not done,
            "note": note}


def rank_badge(ranks: list[int], count: int | None = None) -> str:
    """The badge of a collapsed line: ``rank 3``, ``ranks 0-1``, or from three ranks on the
    count first and a few rank ids: ``x5 ranks 0,512,1024,…`` (``x2048 ranks 0-2047``)."""
    n = len(ranks) if count is None else count
    if n == 1 and ranks:
        return f"rank {ranks[0]}"
    label = rank_set_label(ranks)
    if n <= 2:
        return f"ranks {label}"
    if len(label) > 24:
        label = ",".join(str(r) for r in sorted(ranks)[:3]) + ",…"
    return f"x{n} ranks {label}"


def format_view(view: dict, failure: dict | None, width: int = 12) -> str:
    """The collapsed view as text, for the CLI: which ranks it read (the failing ones first,
    and the healthy sample of a big job), ``[ranks 0-1] loading data...`` or ``[x5 ranks
    0,512,1024,…] UserWarning: ...`` per line (:func:`rank_badge`), a heading per attempt and
    stream, then the first failure."""
    out, head = [], None
    if view.get("sampled"):
        failing = view.get("failing_ranks") or []
        what = (f"failing rank{'s' if len(failing) > 1 else ''} {', '.join(map(str, failing))}" if failing
                else "no failing rank in the events")
        sample = view.get("sample_ranks") or []
        out.append(f"=== {what}; healthy ranks for contrast: {rank_set_label(sample) or 'none'} "
                   f"({len(view.get('ranks') or [])} of {view.get('rank_count')} ranks read; --ranks to choose) ===")
    for ln in view.get("lines", []):
        h = (ln.get("attempt"), ln.get("stream"))
        if h != head:
            head = h
            out.append(f"--- attempt {h[0]} {h[1]} ---" if h[0] is not None else f"--- {h[1]} ---")
        badge = f"[{rank_badge(ln['ranks'], ln.get('count'))}]"
        out.append(f"{badge:<{width}} {ln['text']}")
    if view.get("truncated"):
        out.append("... (cut at this request's budget: narrow the ranks or use --length)")
    if failure:
        out.append("")
        where = f" on {failure['node']}" if failure.get("node") else ""
        out.append(f"first failure: rank {failure['rank']}{where}: {failure.get('exception') or '(no traceback found)'}")
        if failure.get("source"):
            out.append(f"  at byte {failure['offset']} of {failure['source']} (found by {failure['found_by']})")
        if failure.get("traceback_text"):
            out.extend("  " + t for t in failure["traceback_text"].splitlines())
    return "\n".join(out) + ("\n" if out else "")


def format_matches(result: dict) -> str:
    """Search matches as text, for the CLI: ``rank R source:offset: line``, then the marker
    of a search cut at its bounds (``truncated ... narrow the search``)."""
    lines = [f"[rank {m['rank']}] {m['source']}:{m['offset']}: {m['text']}" for m in result["matches"]]
    if not result["done"]:
        lines.append(f"... {result.get('note') or 'truncated: more to search'} (scanned {result['scanned']} bytes)")
    return "\n".join(lines) + ("\n" if lines else "")


# ---------------------------------------------------------------------------- one request
def triage(client, job_id: str, ranks: list[int] | None = None, cursor: dict[str, int] | None = None,
           length: int = DEFAULT_LENGTH, tail: bool = False, q: str | None = None, regex: bool = False,
           scan: int = DEFAULT_SCAN, limit: int = 200, around_traceback: bool = False,
           near_time: float | None = None, failure: bool = True, faults: list[dict] | None = None) -> dict:
    """One triage request of job ``job_id`` through ``client`` (a :class:`hyperpod_lab.submit.client.Client`).

    Which ranks (``ranks`` None): a job of at most :data:`SMALL_JOB` ranks, every rank; a
    bigger one's view reads the *failing* ranks the job's ``fault.detected``
    events name (the first failure first, at most :data:`MAX_FAILING`) and
    :data:`SAMPLE_HEALTHY` healthy ranks spread evenly over the rest, for contrast
    (:mod:`hyperpod_lab.submit.logtriage.select`); never every rank's files, so the files it
    opens are bounded by a constant whatever the rank count. Without a fault event, the root
    cause torchelastic's report in the whole job's log names is the failing rank. A follow
    poll (a ``cursor``, no ``ranks``) reads the ranks its cursor names; a search goes through
    every rank, bounded per request (:func:`search`).

    Args:
        ranks: the ranks to show (None: the failing ranks and the sample, as above).
        cursor: per-source byte offsets from an earlier reply (follow mode: only new lines).
        length: bytes read per source, 1 to :data:`MAX_LENGTH`.
        tail: sources the cursor does not name are read from their last ``length`` bytes
            (else from their first byte).
        q, regex, scan, limit: a search instead of the view (:func:`search`); ``cursor`` is then
            the search's own cursor.
        around_traceback: the view is the window around the first failing rank's traceback
            (:func:`around`); with ``ranks``, the first failure among them; a rank that failed
            without a traceback (SIGKILL, a lost node): the tail of its files.
        near_time: seconds since the epoch: pick the failing rank's traceback nearest it.
        failure: also find the first failure (:func:`first_failure`).
        faults: the job's ``fault.detected`` events as dicts, where the caller has them (the
            server's fold: :func:`faults_from_aggregate`); None: read from the event files
            (:func:`read_fault_events`, one ``read_tails`` call).

    Returns:
        ``{"job_id", "ranks" (the ranks read, ascending), "failing_ranks" (the first failure
        first), "sample_ranks" (the healthy ranks read for contrast), "sampled" (True: not every
        rank that started was read), "rank_count" (ranks that started), "known_ranks", "nodes":
        {R: node}, "lines" | "matches", "cursor", "sizes", "read", "more" | "done", "truncated",
        "budget"? (a view), "scanned"?, "note"? (a search), "first_failure", "bytes_read"}`` (see
        :func:`read_view`, :func:`search`, :func:`first_failure`); ``bytes_read`` counts every
        byte read for the reply. Whatever the number of ranks, a view reads at most
        :data:`VIEW_BYTES` bytes and keeps :data:`VIEW_LINES` lines, the first failure reads
        :data:`FAILURE_BYTES` bytes, a search ``scan`` bytes (one line held at a time).

    Raises:
        UnknownJob; SpecError for a bad ``q``; ClusterUnreachable and the like from the backend.
    """
    rec = client.get(job_id)
    sched = client.scheduler(rec.cluster)
    logs = RankLogs(sched, rec)
    known = logs.ranks()
    try:
        from hyperpod_lab.submit.jobs import JobStatus

        over = JobStatus(rec.status).is_terminal()
    except ValueError:
        over = False
    pick = ranks is None and not q and not cursor and len(known) > SMALL_JOB  # the failing ranks and a sample
    if faults is None and (failure or around_traceback or pick):
        faults = read_fault_events(sched.remote, rec.job_dir) if getattr(sched, "remote", None) else []
    failing, sample = view_ranks(known, faults or [])
    job_log_fail = None
    if pick and not failing and len(known) > SAMPLE_HEALTHY and (failure or around_traceback):
        # no fault event: torchelastic's report in the job's log names the root cause (one file)
        job_log_fail = _job_log_failure(logs, set(known), max(length, DEFAULT_LENGTH))
        if job_log_fail is not None:
            failing, sample = view_ranks(known, [{"data": {"rank": job_log_fail["rank"]}}])
    if ranks is not None:
        chosen = ranks
    elif q or len(known) <= SMALL_JOB:  # a small job: every rank (ranks that start later too)
        chosen = known
    elif cursor:
        have = set(known)
        chosen = [r for r in cursor_ranks(cursor) if r in have] or sorted({*failing, *sample})
    else:
        chosen = sorted({*failing, *sample})
    shown = set(chosen)
    out: dict = {"job_id": job_id, "ranks": chosen, "failing_ranks": [r for r in failing if r in shown],
                 "sample_ranks": [r for r in sample if r in shown and not q], "sampled": len(shown) < len(known),
                 "rank_count": len(known), "known_ranks": known}
    fail = None
    if failure or around_traceback:
        # a search of every rank looks only at the failing ones (or a small job's ranks)
        look = chosen if not q else ([r for r in failing if r in shown]
                                     or (chosen if len(chosen) <= MAX_FAILING + SAMPLE_HEALTHY else []))
        fail = first_failure(logs, look, faults, max(length, DEFAULT_LENGTH), near_time) if look else None
        if fail is None and job_log_fail is not None and job_log_fail["rank"] in shown:
            fail = job_log_fail
    out["first_failure"] = fail
    if q:
        out.update(search(logs, chosen, q, regex, cursor, scan, limit))
    elif around_traceback:
        if fail and fail.get("offset") is not None:
            out.update(around(logs, fail, length))
        elif fail:  # it failed without a traceback (a kill, a lost node): its last lines
            out.update(read_view(logs, [fail["rank"]], {}, length, True, over))
        else:
            out.update({"lines": [], "cursor": {}, "sizes": {}, "read": {}, "more": False, "truncated": False,
                        "budget": {"bytes": VIEW_BYTES, "lines": VIEW_LINES}})
    else:
        out.update(read_view(logs, chosen, cursor or {}, length, tail, over))
    shown_now = chosen if not q else sorted({m["rank"] for m in out["matches"]} | ({fail["rank"]} if fail else set()))
    out["nodes"] = {r: logs.node(r) for r in shown_now}
    out["cursor"] = encode_cursor(out["cursor"])
    out["bytes_read"] = logs.bytes_read
    return out
