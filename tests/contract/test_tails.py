"""The event-file tailer (:class:`hyperpod_lab.tails.FileTailer`, issue 27 item 2): poll after poll it
returns what the stateless :func:`hyperpod_lab.tails.read_tails` returns, while a poll of a
directory where no file was created or removed lists nothing (one ``pread`` a file), and the
login-node program's requests carry only the offsets that moved.

Real files on this machine's file system; the program's replies are parsed as the SSH client
parses them (the program over a real sshd is in ``tests/server/test_scale_cursors.py``).
"""

from __future__ import annotations

import base64
import json
import os
import random
import time

from hyperpod_lab import tails
from hyperpod_lab.events import EventReader, EventWriter, LocalFiles


def _same(tailer, d, starts, wants=None, max_bytes=None):
    got = tailer.read_tails(str(d), starts, wants, max_bytes)
    want = tails.read_tails(str(d), starts, wants, max_bytes)
    assert got == want, (starts, got, want)
    return got


def test_poll_after_poll_the_tailer_answers_what_a_fresh_listing_answers(tmp_path):
    """Random appends (some with partial lines), new files, removed files, a file replaced by
    another under its name (rename) and bounded reads: after each change the tailer's reply
    equals the stateless one for the same offsets."""
    rnd = random.Random(27)
    d = tmp_path / "events"
    d.mkdir()
    tailer = tails.FileTailer(max_fds=6)  # fewer descriptors than files: the rest are read by path
    starts: dict[str, int] = {}
    names = [f"rank-{i}.jsonl" for i in range(10)]
    for rnd_step in range(300):
        op = rnd.random()
        name = rnd.choice(names)
        p = d / name
        if op < 0.7:
            with open(p, "ab") as f:
                f.write(b'{"x":%d}\n' % rnd_step + (b'{"part' if rnd.random() < 0.2 else b""))
        elif op < 0.8 and p.exists():
            p.unlink()
            starts.pop(name, None)
        elif op < 0.9:
            tmp = d / ".new"
            tmp.write_bytes(b'{"replaced":%d}\n' % rnd_step)
            os.replace(tmp, p)
            starts.pop(name, None)
        if not rnd_step % 3:  # as if a while had passed since the directory last changed
            os.utime(d, ns=(10**18 + rnd_step, 10**18 + rnd_step))
        wants = {rnd.choice(names): rnd.choice([0, 5])} if rnd.random() < 0.3 else None
        sizes, data, _ = _same(tailer, d, starts, wants, max_bytes=rnd.choice([None, 8, 64]))
        for n, b in data.items():  # a reader's cursor: past the last complete line read
            if b.rfind(b"\n") >= 0:
                starts[n] = starts.get(n, 0) + b.rfind(b"\n") + 1
    assert tailer.listings < 300  # some polls were fast (no file created or removed since the last listing)
    tailer.close()


def test_a_fast_poll_lists_nothing_and_a_new_file_is_seen_at_once(tmp_path):
    """After one listing, appends to existing files are read without another listing (what
    makes a steady poll of 2,051 files cheap); a file created since is seen in the same poll
    (the directory's mtime changed); ``relist_s`` bounds how long a listing is trusted."""
    job = tmp_path / "job"
    writers = [EventWriter(str(job), f"rank-{r}", "j") for r in range(50)]
    for w in writers:
        w.emit("step", step=0)
    time.sleep(0.15)  # (a directory changed less than 0.1 s ago is listed again at the next poll)
    files = LocalFiles()
    reader = EventReader(str(job), files)
    assert len(reader.poll()) == 50
    tailer = files._tailer()
    assert tailer.listings == 1
    for i in range(3):
        writers[7].emit("step", step=i + 1)
        assert [(e.writer, e.data["step"]) for e in reader.poll()] == [("rank-7", i + 1)]
        assert reader.poll() == []
    assert tailer.listings == 1, "appends alone must not list the directory again"
    EventWriter(str(job), "agent-n9", "j").emit("fault.detected", rank=3, reason="exception")
    assert [e.writer for e in reader.poll()] == ["agent-n9"]
    assert tailer.listings == 2
    time.sleep(0.15)
    for r in (1, 2):  # listed once more (the directory had just changed), then trusted
        writers[r].emit("step", step=9)
        assert [e.writer for e in reader.poll()] == [f"rank-{r}"] and tailer.listings == 3
    tailer.relist_s = 0.0
    writers[3].emit("step", step=9)
    assert [e.writer for e in reader.poll()] == ["rank-3"] and tailer.listings == 4
    files.close()


def test_a_file_replaced_by_a_link_is_never_followed(tmp_path):
    """An event file swapped for a symbolic link to a file outside the job (a user's secret)
    after the tailer opened it: no byte of the link's target is ever returned."""
    d = tmp_path / "events"
    d.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b'{"secret":"do not read"}\n' * 4)
    (d / "rank-0.jsonl").write_bytes(b'{"a":1}\n')
    tailer = tails.FileTailer()
    assert tailer.read_tails(str(d), {})[1] == {"rank-0.jsonl": b'{"a":1}\n'}
    assert tailer.read_tails(str(d), {"rank-0.jsonl": 8}) == ({}, {}, {})  # fast poll: the file is open
    (d / "rank-0.jsonl").unlink()
    os.symlink(secret, d / "rank-0.jsonl")
    for starts in ({}, {"rank-0.jsonl": 8}, {}):
        sizes, data, errors = tailer.read_tails(str(d), starts)
        assert b"secret" not in b"".join(data.values()) and "rank-0.jsonl" not in sizes, (sizes, data, errors)
    tailer.close()


def test_the_program_takes_only_the_offsets_that_moved(tmp_path):
    """:class:`hyperpod_lab.tails.Program`: a request with ``base`` (the last reply's ``gen``)
    and only the moved offsets gets the reply a request with every offset gets; a ``base`` it
    does not hold gets ``resend``; the steady request of 2,048 files with 205 moved offsets is a
    tenth of the full one's size."""
    d = tmp_path / "events"
    d.mkdir()
    for i in range(2048):
        (d / f"rank-{i}.jsonl").write_bytes(b'{"s":0}\n')
    prog = tails.Program()
    full = {f"rank-{i}.jsonl": 8 for i in range(2048)}
    first = json.loads(prog.reply(json.loads(tails.request(str(d), full))))
    assert first["sizes"] == {} and isinstance(first["gen"], int)
    for i in range(0, 2048, 10):
        with open(d / f"rank-{i}.jsonl", "ab") as f:
            f.write(b'{"s":1}\n')
    fresh = json.loads(tails.Program().reply(json.loads(tails.request(str(d), full))))
    delta_req = tails.request(str(d), {}, base=first["gen"])
    again = json.loads(prog.reply(json.loads(delta_req)))
    assert again["sizes"] == fresh["sizes"] and again["data"] == fresh["data"] and len(again["data"]) == 205
    moved = {n: 16 for n in again["sizes"]}
    steady = tails.request(str(d), moved, base=again["gen"])
    assert len(steady) * 5 < len(tails.request(str(d), {**full, **moved})), (len(steady),)
    quiet = json.loads(prog.reply(json.loads(steady)))
    assert quiet["sizes"] == {}
    # a name dropped from the request (it left the reader's cursor) is as if never sent: read from 0
    dropped = json.loads(prog.reply(json.loads(tails.request(str(d), {}, base=quiet["gen"], drop={"rank-0.jsonl"}))))
    assert dropped["sizes"] == {"rank-0.jsonl": 16} and base64.b64decode(dropped["data"]["rank-0.jsonl"]) == b'{"s":0}\n{"s":1}\n'
    assert json.loads(prog.reply(json.loads(tails.request(str(d), {}, base=12345)))) == {"resend": True}
    prog.tailer.close()


def _settled(path):
    """As if a while had passed since the directory last changed (a directory changed less than
    0.1 s ago is listed again at the next poll)."""
    os.utime(path, ns=(10**18, 10**18))


def test_a_steady_poll_probes_only_the_files_the_change_log_names(tmp_path):
    """With the change log (each EventWriter names its file in ``events/changes.log`` after each
    event), a steady poll of 300 writer files probes the 3 that grew, not 300, and returns their
    events; an append whose name never reached the log (a writer killed between the two) is seen
    at the next listing; junk in the log (on NFS two names can be written over each other) is
    passed over."""
    job = tmp_path / "job"
    writers = [EventWriter(str(job), f"rank-{r}", "j") for r in range(300)]
    for w in writers:
        w.emit("step", step=0)
    assert (job / "events" / tails.CHANGES).read_bytes().split() == [f"rank-{r}.jsonl".encode() for r in range(300)]
    from hyperpod_lab import envexec  # (the login node's submit names the client's file in the same log)

    assert envexec.CHANGES_LOG == tails.CHANGES
    _settled(job / "events")
    files = LocalFiles()
    reader = EventReader(str(job), files)
    assert len(reader.poll()) == 300
    tailer = files._tailer()
    for i in range(3):
        for r in (5, 150, 299):
            writers[r].emit("step", step=i + 1)
        assert sorted((e.writer, e.data["step"]) for e in reader.poll()) == [
            ("rank-150", i + 1), ("rank-299", i + 1), ("rank-5", i + 1)]
        assert tailer.probed == 3, tailer.probed
        assert reader.poll() == [] and tailer.probed == 0
    assert tailer.listings == 1
    with open(job / "events" / "rank-7.jsonl", "ab") as f:  # an event whose name is not in the log
        f.write(b'{"v":1,"kind":"step","job_id":"j","time":1.0,"writer":"rank-7","seq":1,"data":{"step":1}}\n')
    with open(job / "events" / tails.CHANGES, "ab") as f:
        f.write(b"rank-\x00\xff-torn\nrank-8.js")  # junk, and a name torn by another writer's
    writers[9].emit("step", step=1)
    assert [e.writer for e in reader.poll()] == ["rank-9"] and tailer.probed == 1
    tailer.relist_s = 0.0
    assert [e.writer for e in reader.poll()] == ["rank-7"] and tailer.listings == 2
    files.close()


def test_pages_and_torn_lines_continue_without_a_new_name_in_the_log(tmp_path):
    """A reader paging (``max_bytes``) through a file whose names are all behind its offset still
    reads the rest of the file, page by page (it asks for the files it has not read to their
    end); a line written in two parts (a torn line, then its end and its name) is read once."""
    job = tmp_path / "job"
    w = EventWriter(str(job), "rank-0", "j")
    others = [EventWriter(str(job), f"rank-{r}", "j") for r in range(1, 50)]
    for o in [w, *others]:
        o.emit("step", step=0)
    _settled(job / "events")
    files = LocalFiles()
    reader = EventReader(str(job), files)
    assert len(reader.poll()) == 50
    for i in range(1, 200):
        w.emit("step", step=i)
    got = [0]
    for _ in range(100):
        page = reader.poll(max_bytes=1000)
        got += [e.data["step"] for e in page if e.writer == "rank-0"]
        if not reader.more:
            break
    assert got == list(range(200))
    assert files._tailer().listings == 1  # every page a fast poll
    path = job / "events" / "rank-1.jsonl"
    line = b'{"v":1,"kind":"step","job_id":"j","time":9.0,"writer":"rank-1","seq":1,"data":{"step":1}}\n'
    with open(path, "ab") as f:
        f.write(line[:40])
    with open(job / "events" / tails.CHANGES, "ab") as f:  # another writer's name after the torn half
        f.write(b"rank-1.jsonl\n")
    assert reader.poll() == []
    with open(path, "ab") as f:
        f.write(line[40:])
    assert [(e.writer, e.data["step"]) for e in reader.poll()] == [("rank-1", 1)]  # no name needed
    assert reader.poll() == []
    files.close()


def test_a_cursor_set_from_outside_reads_every_file_again(tmp_path):
    """A reader whose cursor is set back from outside (a client resuming elsewhere) does not use
    the change log's offset of its last poll: every file is probed and its events come again."""
    job = tmp_path / "job"
    for r in range(20):
        EventWriter(str(job), f"rank-{r}", "j").emit("step", step=0)
    _settled(job / "events")
    reader = EventReader(str(job))
    assert len(reader.poll()) == 20 and reader.poll() == []
    reader.cursor["rank-3.jsonl"] = 0  # one file's offset moved back (no new name in the log)
    assert [e.writer for e in reader.poll()] == ["rank-3"]
    reader.cursor = {}
    assert len(reader.poll()) == 20 and reader.poll() == []


def test_random_writers_and_two_threads_read_every_event_once(tmp_path):
    """Writers appending at random (some with a torn line first), one reader polled from two
    threads in turn (each thread has its own tailer: the log offset one gave goes to the other),
    with random page sizes: every event is read exactly once, in each file's order."""
    import threading

    rnd = random.Random(2048)
    job = tmp_path / "job"
    writers = [EventWriter(str(job), f"rank-{r}", "j") for r in range(40)]
    for w in writers:
        w.emit("step", step=0)
    _settled(job / "events")
    files = LocalFiles()
    reader = EventReader(str(job), files)
    seen: list[tuple[str, int]] = []

    def poll_once():
        seen.extend((e.writer, e.data["step"]) for e in reader.poll(max_bytes=rnd.choice([None, 200, 2000])))

    written = {w.writer: 1 for w in writers}
    for rnd_step in range(400):
        for w in rnd.sample(writers, rnd.randint(0, 5)):
            w.emit("step", step=written[w.writer])
            written[w.writer] += 1
        t = threading.Thread(target=poll_once)
        t.start()
        t.join()
        if rnd_step % 2:
            poll_once()
    for _ in range(200):  # the rest, in pages
        poll_once()
        if not reader.more:
            break
    poll_once()
    for w in writers:
        assert [s for n, s in seen if n == w.writer] == list(range(written[w.writer])), w.writer
    files.close()


def test_the_program_probes_what_the_log_names(tmp_path):
    """The login node's program with the client's log offset (as the SSH client sends it, in the
    request's ``starts``, only when it moved): the steady request probes the 205 files of 2,048
    that grew."""
    job = tmp_path / "job"
    writers = [EventWriter(str(job), f"rank-{r}", "j") for r in range(2048)]
    for w in writers:
        w.emit("step", step=0)
    _settled(job / "events")
    d = str(job / "events")
    prog = tails.Program()
    first = tails.parse_reply(prog.reply(json.loads(tails.request(d, {}))))
    starts = {n: s for n, s in first[0].items()}
    assert tails.CHANGES in starts and len(first[1]) == 2048
    for w in writers[::10]:
        w.emit("step", step=1)
    sizes, data, _, gen, probed = tails.parse_reply(prog.reply(json.loads(tails.request(d, starts, base=first[3]))))
    assert len(data) == 205 and probed == 205 and sizes[tails.CHANGES] > starts[tails.CHANGES]
    moved = {n: s for n, s in sizes.items()}
    assert tails.parse_reply(prog.reply(json.loads(tails.request(d, moved, base=gen))))[:3] == ({}, {}, {})
    assert prog.tailer.probed == 0 and first[4] is None  # (the first request listed the directory)
    prog.tailer.close()


def test_a_writer_that_never_names_its_file_is_probed_every_poll_after_one_listing(tmp_path):
    """A writer that does not name its file in the change log (an older runtime on the cluster
    than the notebook's, whose events the new client's own ``submitted`` put beside a log): its
    appends are seen at the next listing, which marks its file silent; from then on every fast
    poll probes it (its next event comes at the next poll), while the named files stay probed
    only when named. A silent file that names itself later leaves the set."""
    job = tmp_path / "job"
    EventWriter(str(job), "client", "j").emit("submitted", nodes=1)  # the log exists
    old = job / "events" / "rank-0.jsonl"
    line = '{{"v":1,"kind":"step","job_id":"j","time":{t},"writer":"rank-0","seq":{t},"data":{{"step":{t}}}}}\n'
    old.write_text(line.format(t=0))
    others = [EventWriter(str(job), f"rank-{r}", "j") for r in range(1, 30)]
    for w in others:
        w.emit("step", step=0)
    _settled(job / "events")
    files = LocalFiles()
    reader = EventReader(str(job), files)
    assert len(reader.poll()) == 31
    tailer = files._tailer()
    with open(old, "a") as f:
        f.write(line.format(t=1))
    assert reader.poll() == [] and tailer.probed == 0  # not named: not probed
    tailer.relist_s = 0.0
    assert [e.data["step"] for e in reader.poll()] == [1]  # the listing sees it, and marks the file
    tailer.relist_s = 3600.0
    for t in (2, 3):
        with open(old, "a") as f:
            f.write(line.format(t=t))
        others[4].emit("step", step=t)
        assert sorted((e.writer, e.data["step"]) for e in reader.poll()) == [("rank-0", t), ("rank-5", t)]
        assert tailer.probed == 2  # the silent file and the named one, not 31
    EventWriter(str(job), "rank-0", "j").emit("step", step=4)  # a writer that names it after all
    assert [e.data["step"] for e in reader.poll()] == [4]
    assert reader.poll() == [] and tailer.probed == 0
    files.close()
