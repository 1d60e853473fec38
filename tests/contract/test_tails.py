"""The event-file tailer (:class:`hyperpod_lab.tails.FileTailer`, issue 27 item 2): poll after poll it
returns what the stateless :func:`hyperpod_lab.tails.read_tails` returns, while a poll of a
directory where no file was created or removed lists nothing (one ``pread`` a file), and the
login-node program's requests carry only the offsets that moved.

Real files on this machine's file system; the program's replies are parsed as the SSH client
parses them (the program over a real sshd is in ``tests/server/test_scale_cursors.py``).
"""

from __future__ import annotations

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
    assert json.loads(prog.reply(json.loads(steady)))["sizes"] == {}
    assert json.loads(prog.reply(json.loads(tails.request(str(d), {}, base=12345)))) == {"resend": True}
    prog.tailer.close()
