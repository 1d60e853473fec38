"""Issue 24, finding 11: a malformed commit marker is a corrupt checkpoint, never a crash.

Whatever bytes a ``COMMITTED`` file holds (a non-hex or non-ASCII ``hmac``, JSON nested
100,000 deep, wrong types, missing fields, NaN, duplicate keys, non-UTF-8, a huge file, a link,
a FIFO), reading it gives either the marker it was signed as or the "corrupt" outcome with a
reason: :class:`~hyperpod_lab.runtime.checkpoint.format.MarkerError` from ``read_marker`` /
``parse_marker``, or a reason string from ``authenticate_marker``. Nothing else is raised, so
rank 0 (which reads the markers for every rank) never dies while the others wait in the
broadcast.

The property test feeds a hand-written list and seeded random mutations of a real, signed marker
(of real files); the end-to-end test runs two real workers (gloo on CPU, this file as the
training script: ``python test_commit_markers.py --steps N | --restore``) whose newest
checkpoints carry the two markers that crashed rank 0 before the fix.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.abspath(__file__)
STEP = 7


# ---- the training script (two workers under hyperpod_lab.node.launch) -------------------------
def train_main(argv: list[str] | None = None) -> None:
    import torch

    import hyperpod_lab.runtime as hp
    from hyperpod_lab.runtime.checkpoint.persistent import Checkpointer

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--restore", action="store_true")
    a = ap.parse_args(argv)
    with hp.init() as ctx:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        state = {"model": model, "extra": {"pos": -1}}
        ckpt = Checkpointer(ctx, every_steps=2, keep_last=5, async_save=False)
        if a.restore:
            start = ckpt.restore(state)
            with open(os.path.join(ctx.job_dir, f"result-{ctx.rank}.json"), "w") as f:
                json.dump({"start": start, "pos": state["extra"]["pos"],
                           "weight": float(model.weight.detach()[0, 0])}, f)
        for step in range(a.steps):
            with torch.no_grad():
                model.weight.fill_(float(step))
            state["extra"]["pos"] = step
            ckpt.maybe_save(step, state)
        ckpt.wait()


# ---- a real, signed marker of real files -------------------------------------------------------
KEY = bytes(range(32))


@pytest.fixture()
def signed(tmp_path):
    """A checkpoint directory of step :data:`STEP` with two real files and a marker signed with
    :data:`KEY`. Returns ``(step_dir, raw marker bytes, marker dict)``."""
    from hyperpod_lab.runtime.checkpoint.format import hash_rank_files, hash_remaining, write_marker

    d = tmp_path / "step-00000007"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(os.urandom(300))
    (d / ".metadata").write_bytes(b"metadata" * 10)
    files = hash_rank_files(str(d), 0)
    hash_remaining(str(d), files)
    write_marker(str(d), STEP, 1, files, KEY)
    raw = (d / "COMMITTED").read_bytes()
    return str(d), raw, json.loads(raw)


def outcome(step_dir: str) -> tuple[str, object]:
    """What a restore's rank 0 makes of ``<step_dir>/COMMITTED`` (the same calls as
    ``Checkpointer._restore_local``): ("authentic", marker) or ("corrupt", reason). Any other
    exception propagates, and fails the test."""
    from hyperpod_lab.runtime.checkpoint.format import authenticate_marker, read_marker

    try:
        marker = read_marker(step_dir)
    except ValueError as e:  # MarkerError; persistent.py and s3.py catch ValueError
        assert str(e), "a corrupt marker's reason is empty"
        return "corrupt", str(e)
    reason = authenticate_marker(marker, KEY, STEP)
    if reason is None:
        return "authentic", marker
    assert isinstance(reason, str) and reason.startswith("authentication failed"), reason
    return "corrupt", reason


def _assert_corrupt_or_original(step_dir: str, raw: bytes, good: dict, label: str) -> str:
    with open(os.path.join(step_dir, "COMMITTED"), "wb") as f:
        f.write(raw)
    try:
        kind, what = outcome(step_dir)
    except Exception as e:  # the property under test: nothing but "corrupt"
        pytest.fail(f"{label}: {type(e).__name__} escaped instead of 'corrupt': {str(e)[:300]} "
                    f"(marker {raw[:120]!r}...)")
    if kind == "authentic":  # only a byte change that keeps the signed content (e.g. whitespace)
        assert what == good, f"{label}: a changed marker authenticated"
    return kind


def _set(obj: dict, path: tuple, value) -> dict:
    obj = json.loads(json.dumps(obj))
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return obj


def _delete(obj: dict, path: tuple) -> dict:
    obj = json.loads(json.dumps(obj))
    target = obj
    for p in path[:-1]:
        target = target[p]
    del target[path[-1]]
    return obj


BAD_VALUES = [None, True, False, -1, 0, 1.5, -0.0, "", "x", "é" * 64, "z" * 64, "A" * 64, "0" * 63, "0" * 65,
              [], [1], {}, {"a": 1}, 2**70, "crc32:zzzzzzzz", "../../etc/passwd", "\u0000"]


def hand_written(good: dict) -> list[tuple[str, bytes]]:
    """Malformed markers written by hand: the raw bytes and what is wrong with them."""
    text = json.dumps(good, sort_keys=True)
    rel = next(iter(good["files"]))
    cases = [
        ("non-hex hmac", json.dumps({**good, "hmac": "z" * 64})),
        ("non-ASCII 64-char hmac", json.dumps({**good, "hmac": "é" * 64}, ensure_ascii=False)),
        ("escaped non-ASCII hmac", json.dumps({**good, "hmac": "\u00e9" * 64})),
        ("surrogate hmac", '{"hmac": "' + "\\ud800" * 64 + '", "step": 7}'),
        ("deep array", "[" * 100_000 + "]" * 100_000),
        ("deep object", '{"a":' * 50_000 + "1" + "}" * 50_000),
        ("deep inside files", text.replace('"files": {', '"files": {"x": ' + "[" * 5000 + "]" * 5000 + ", ", 1)),
        ("deep unterminated", "[" * 200_000),
        ("brackets in strings are not depth", json.dumps({**good, "note": "[" * 1000})),
        ("not an object: list", "[1, 2, 3]"), ("not an object: string", '"COMMITTED"'),
        ("not an object: number", "7"), ("null", "null"), ("true", "true"), ("empty", ""), ("whitespace", "  \n"),
        ("truncated", text[: len(text) // 2]), ("trailing garbage", text + "}"), ("two objects", text + text),
        ("NaN", text.replace('"step": 7', '"step": NaN')), ("Infinity", text.replace('"step": 7', '"step": Infinity')),
        ("-Infinity time", text.replace('"time": ', '"time": -Infinity, "x": ', 1)),
        ("overflowing float", text.replace('"time": ', '"time": 1e999, "x": ', 1)),
        ("huge integer", text.replace('"step": 7', '"step": ' + "9" * 5000)),
        ("duplicate hmac", text[:-1] + ', "hmac": "' + "0" * 64 + '"}'),
        ("duplicate step", text[:-1] + ', "step": 7}'),
        ("duplicate file", text.replace(f'"files": {{"{rel}": ', f'"files": {{"{rel}": {{}}, "{rel}": ', 1)),
        ("unsafe path", json.dumps(_set(good, ("files", "../x"), good["files"][rel]))),
        ("absolute path", json.dumps(_set(good, ("files", "/etc/passwd"), good["files"][rel]))),
        ("NUL path", json.dumps(_set(good, ("files", "a\u0000b"), good["files"][rel]))),
        ("files empty", json.dumps({**good, "files": {}})), ("files null", json.dumps({**good, "files": None})),
        ("files list", json.dumps({**good, "files": [1]})),
        ("BOM", "\ufeff" + text),
    ]
    out = [(label, body.encode("utf-8", "surrogatepass")) for label, body in cases]
    out += [("UTF-16", text.encode("utf-16")), ("UTF-32", text.encode("utf-32")),
            ("latin-1 bytes", b'{"step": 7, "hmac": "' + b"\xe9" * 64 + b'"}'), ("lone 0xff", b"\xff"),
            ("NUL bytes", b"\0" * 100), ("random binary", bytes(random.Random(1).randrange(256) for _ in range(4096)))]
    # every field: removed, or replaced by each value of the wrong type or range
    paths = [(k,) for k in good] + [("files", rel, k) for k in good["files"][rel]] + [("files", rel)]
    for path in paths:
        out.append((f"missing {'.'.join(path)}", json.dumps(_delete(good, path)).encode()))
        for value in BAD_VALUES:
            if value == good_value(good, path):
                continue
            out.append((f"{'.'.join(path)} = {value!r:.30}",
                        json.dumps(_set(good, path, value), ensure_ascii=False).encode("utf-8", "surrogatepass")))
    return out


def good_value(good: dict, path: tuple):
    v = good
    for p in path:
        v = v[p]
    return v


def mutations(raw: bytes, seed: int, n: int) -> list[tuple[str, bytes]]:
    """``n`` random byte-level mutations of the good marker (seeded: reproducible)."""
    rnd = random.Random(seed)
    tokens = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"[" * 3000, b"{", b"}", b"]", b'"', b"\\", b",", b":",
              b"null", b"true", b"\xff", b"\xc3", b"\xed\xa0\x80", "é".encode(), b"9" * 5000, b"\0"]
    values = [b'"' + "\u00e9".encode() * 64 + b'"', b'"' + b"z" * 64 + b'"', b'"\\u00e9' * 64 + b'"',
              b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000, b"NaN", b"1e999", b"-Infinity",
              b"null", b"true", b"[]", b"{}", b"-1", b"1.5", b"9" * 5000, b'""', b'"../x"']
    scalar = re.compile(rb'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')
    out = []
    for i in range(n):
        b = bytearray(raw)
        for _ in range(rnd.randint(1, 4)):
            op = rnd.randrange(9)
            if op >= 6:  # replace a JSON string or number (a key or a value) with a hostile value
                found = list(scalar.finditer(bytes(b)))
                if found:
                    m = rnd.choice(found)
                    b[m.start():m.end()] = rnd.choice(values)
                continue
            pos = rnd.randrange(len(b) + 1)
            if op == 0 and b:  # flip bits of one byte
                b[min(pos, len(b) - 1)] ^= rnd.randrange(1, 256)
            elif op == 1:  # delete a range
                del b[pos:pos + rnd.randint(1, 40)]
            elif op == 2:  # insert a token
                b[pos:pos] = rnd.choice(tokens)
            elif op == 3:  # duplicate a range
                b[pos:pos] = b[pos:pos + rnd.randint(1, 80)]
            elif op == 4:  # truncate
                del b[pos:]
            else:  # replace a byte with a random printable one
                if b:
                    b[min(pos, len(b) - 1)] = rnd.randrange(32, 127)
        out.append((f"mutation {seed}/{i}", bytes(b)))
    return out


# ---- the property ------------------------------------------------------------------------------
def test_good_marker_authenticates(signed):
    step_dir, raw, good = signed
    assert outcome(step_dir) == ("authentic", good)


def test_every_malformed_marker_is_corrupt_and_nothing_else_is_raised(signed):
    step_dir, raw, good = signed
    cases = hand_written(good)
    assert len(cases) > 150
    for label, body in cases:
        kind = _assert_corrupt_or_original(step_dir, body, good, label)
        assert kind == "corrupt", f"{label}: accepted"


def test_random_mutations_of_a_signed_marker_are_corrupt_or_unchanged(signed):
    step_dir, raw, good = signed
    kinds = {"corrupt": 0, "authentic": 0}
    for label, body in mutations(raw, seed=24, n=1500):
        kinds[_assert_corrupt_or_original(step_dir, body, good, label)] += 1
    assert kinds["corrupt"] > 1400, kinds


def test_the_reasons_name_the_problem(signed):
    step_dir, raw, good = signed
    cases = dict(hand_written(good))
    rel = next(iter(good["files"]))
    cases["uppercase sha256"] = json.dumps(_set(good, ("files", rel, "sha256"), "A" * 64)).encode()
    want = {"non-ASCII 64-char hmac": "'hmac' is not 64 lowercase hex digits",
            "non-hex hmac": "'hmac' is not 64 lowercase hex digits",
            "deep array": "nests JSON 100000 deep", "NaN": "holds NaN", "duplicate hmac": "'hmac' twice",
            "latin-1 bytes": "not UTF-8", "not an object: list": "not a JSON object", "step = -1": "'step' is -1",
            "huge integer": "not JSON", "missing hmac": "not signed", "missing files": "HMAC does not match",
            "uppercase sha256": "sha256 that is not 64 hex digits", "unsafe path": "unsafe path '../x'"}
    for label, text in want.items():
        with open(os.path.join(step_dir, "COMMITTED"), "wb") as f:
            f.write(cases[label])
        kind, reason = outcome(step_dir)
        assert kind == "corrupt" and text in reason, (label, reason)
    from hyperpod_lab.runtime.checkpoint.format import MarkerError, parse_marker

    with pytest.raises(MarkerError, match="nests JSON"):
        parse_marker(cases["deep object"])


def test_huge_linked_and_special_markers_are_corrupt_without_reading_them(signed):
    from hyperpod_lab.runtime.checkpoint.format import MAX_MARKER_BYTES

    step_dir, raw, good = signed
    path = os.path.join(step_dir, "COMMITTED")
    with open(path, "wb") as f:  # a sparse file over the cap: refused by its size
        f.truncate(MAX_MARKER_BYTES + 1)
    assert outcome(step_dir)[0] == "corrupt" and "over the limit" in outcome(step_dir)[1]
    with open(path, "wb") as f:  # valid JSON, just too big
        f.write(b'{"pad": "' + b"x" * MAX_MARKER_BYTES + b'"}')
    assert "over the limit" in outcome(step_dir)[1]
    os.remove(path)
    os.symlink("/dev/zero", path)  # a link to an endless file: never followed
    assert outcome(step_dir) == ("corrupt", "commit marker is a symbolic link, not a file (planted?)")
    os.remove(path)
    os.mkfifo(path)  # a FIFO nobody writes: opening it must not block
    assert outcome(step_dir) == ("corrupt", "commit marker is not a regular file")
    os.remove(path)
    os.mkdir(path)
    with pytest.raises(OSError):  # a directory: unreadable (persistent.py reports it as such)
        outcome(step_dir)


def test_verify_never_raises():
    from hyperpod_lab.runtime.checkpoint.auth import sign, verify

    good = sign(KEY, "d", {"a": 1})
    assert verify(KEY, "d", {"a": 1}, good)
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    for obj, tag in [({"a": 1}, "é" * 64), ({"a": 1}, "\ud800" * 64), ({"a": 1}, good.upper()),
                     ({"a": 1}, good + "\n"), ({"a": 1}, None), ({"a": 1}, 7), ({"a": float("nan")}, good),
                     ({"a": object()}, good), ({"a": 10**5000}, good), (nested, good)]:
        assert verify(KEY, "d", obj, tag) is False


# ---- end to end: two real workers ---------------------------------------------------------------
def _env(job_dir: str, job_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in [k for k in env if k.startswith(("HYPERPOD_LAB_", "TORCHELASTIC_")) or k in (
            "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURMD_NODENAME")]:
        env.pop(k)
    env.update({"HYPERPOD_LAB_JOB_DIR": job_dir, "HYPERPOD_LAB_JOB_ID": job_id, "OMP_NUM_THREADS": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    return env


def _launch(job_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "0", "--monitor-interval", "0.1", "--log-dir",
                           os.path.join(job_dir, "logs"), "--tee", "3", SCRIPT, *args],
                          cwd=ROOT, env=_env(job_dir, os.path.basename(job_dir)), capture_output=True, text=True,
                          timeout=240)


def test_two_ranks_skip_crafted_markers_and_restore_the_previous_good_checkpoint(tmp_path):
    from agents import kinds, read_events

    job_dir = str(tmp_path / "job")
    p = _launch(job_dir, "--steps", "8")  # committed steps 1, 3, 5, 7
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    ck = os.path.join(job_dir, "checkpoints")

    def remark(step: int, edit) -> None:
        path = os.path.join(ck, f"step-{step:08d}", "COMMITTED")
        with open(path, encoding="utf-8") as f:
            text = edit(json.load(f))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    remark(7, lambda m: json.dumps({**m, "hmac": "é" * 64}, ensure_ascii=False))  # TypeError on rank 0 before
    remark(5, lambda m: "[" * 100_000 + "]" * 100_000)                          # RecursionError before
    remark(3, lambda m: json.dumps({**m, "step": float("nan")}))                  # NaN
    p = _launch(job_dir, "--restore")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    for rank in (0, 1):  # both ranks restored step 1: no rank raised, none was left waiting
        with open(os.path.join(job_dir, f"result-{rank}.json")) as f:
            assert json.load(f) == {"start": 2, "pos": 1, "weight": 1.0}
    bad = [e["data"] for e in kinds(read_events(job_dir), "checkpoint.corrupt", tier="persistent")]
    assert [(d["step"], os.path.basename(d["path"])) for d in bad] == [(7, "COMMITTED"), (5, "COMMITTED"),
                                                                       (3, "COMMITTED")], bad
    assert "'hmac' is not 64 lowercase hex digits" in bad[0]["reason"]
    assert "nests JSON 100000 deep" in bad[1]["reason"]
    assert "NaN" in bad[2]["reason"]
    aside = sorted(n.rsplit("-", 1)[0] for n in os.listdir(ck) if n.startswith("corrupt-step-"))
    assert aside == ["corrupt-step-00000003", "corrupt-step-00000005", "corrupt-step-00000007"]  # kept as evidence


if __name__ == "__main__":
    train_main()
