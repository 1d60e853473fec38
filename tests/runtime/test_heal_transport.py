"""Issue 24, finding 13: the heal transport loads only state authenticated with the job's key.

A replacement replica fetches the training state from whatever URL the quorum names. torchft's
transport unpickles the response (``weights_only=False``); ours
(:func:`hyperpod_lab.runtime.checkpointless.ft.bound_http_transport`) checks the HMAC-SHA256
trailer under the job's checkpoint key before deserialising anything, then loads with
``weights_only=True``.

Real parts: the transports' own HTTP servers on 127.0.0.1, real torch state (a model's and an
AdamW optimizer's ``state_dict`` after a step), and for the hostile side a real HTTP server in this
process serving a pickle whose loading would create a marker file (the proof that code ran).
"""

from __future__ import annotations

import io
import os
import urllib.request
from datetime import timedelta

import pytest
import torch
from loopback_http import LoopbackHTTP

TIMEOUT = timedelta(seconds=10)
STEP = 3


class _Evil:
    """Pickles to "run ``touch <path>``": the proof that something was unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _torch_stream(obj) -> bytes:
    """``obj`` in the streaming format torchft's transport speaks (torch's ``_streaming_save``)."""
    from torchft.checkpointing._serialization import _streaming_save

    buf = io.BytesIO()
    _streaming_save(obj, buf)
    return buf.getvalue()


def _signed(body: bytes, key: bytes, path: str) -> bytes:
    """``body`` with the trailer our serving side appends (domain, path, body under ``key``)."""
    import hashlib
    import hmac

    from hyperpod_lab.runtime.checkpointless.ft import HEAL_DOMAIN

    return body + hmac.new(key, HEAL_DOMAIN + b"\n" + path.encode() + b"\n" + body, hashlib.sha256).digest()


class Hostile(LoopbackHTTP):
    """A real HTTP server on 127.0.0.1 that answers every GET with ``body(path)``: what a process
    on the network that the quorum names (or one in between) can send."""

    def __init__(self, body):
        self.requests: list[str] = []

        def answer(request) -> tuple[int, str, bytes]:
            self.requests.append(request.path)
            return 200, "application/octet-stream", body(request.path)

        super().__init__(answer)

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.port}/checkpoint/"


@pytest.fixture()
def receiver():
    from hyperpod_lab.runtime.checkpointless.ft import bound_http_transport

    t = bound_http_transport("127.0.0.1", TIMEOUT)  # this process's key: what the hostile side lacks
    yield t
    t.shutdown(wait=False)


def _real_state() -> dict:
    """What torchft's Manager sends: our Checkpointless state (model, AdamW after a step with
    its step tensors and betas tuples, cursor, extra with an RNG state) and torchft's own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return {"user": {"default": {"model": model.state_dict(), "optim": opt.state_dict(), "cursor": 192,
                                 "extra": {"rng": torch.get_rng_state(), "note": "x", "lr": None}}},
            "torchft": {"step": STEP, "batches_committed": 6}}


def _same(a, b, where="state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b and type(a) is type(b), where


def _fetch_failure(receiver, metadata: str, step: int = STEP) -> BaseException | None:
    try:
        receiver.recv_checkpoint(src_rank=0, metadata=metadata, step=step, timeout=TIMEOUT)
    except Exception as e:
        return e
    return None


def _assert_rejected(error: BaseException | None, marker, cause: str) -> None:
    assert not marker.exists(), "the fetched state was unpickled: code ran in the recovering replica"
    assert error is not None, "the state was accepted"
    assert type(error).__name__ == "HealStateRejected", f"{type(error).__name__}: {error}"
    assert cause in str(error), str(error)


# ---- a good round trip -------------------------------------------------------------------------
def test_real_state_round_trips(receiver):
    from hyperpod_lab.runtime.checkpointless.ft import bound_http_transport

    sender = bound_http_transport("127.0.0.1", TIMEOUT)
    try:
        state = _real_state()
        sender.send_checkpoint(dst_ranks=[1], step=STEP, state_dict=state, timeout=TIMEOUT)
        got = receiver.recv_checkpoint(src_rank=0, metadata=sender.metadata(), step=STEP, timeout=TIMEOUT)
        _same(state, got)
        # and it loads into a fresh model and optimizer
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        model.load_state_dict(got["user"]["default"]["model"])
        torch.optim.AdamW(model.parameters(), lr=1e-3).load_state_dict(got["user"]["default"]["optim"])
        # the response carries the trailer: HMAC-SHA256 under the key, 32 bytes after the torch stream
        from hyperpod_lab.runtime.checkpoint.auth import process_key

        with urllib.request.urlopen(f"{sender.metadata()}{STEP}/full", timeout=10) as f:
            raw = f.read()
        assert raw == _signed(raw[:-32], process_key(), f"/checkpoint/{STEP}/full")
    finally:
        sender.shutdown(wait=False)


# ---- hostile and tampered state -------------------------------------------------------------------
def test_unauthenticated_hostile_pickle_is_not_loaded(receiver, tmp_path):
    marker = tmp_path / "PWNED"
    evil = _torch_stream({"user": _Evil(str(marker)), "torchft": {"step": STEP}})
    srv = Hostile(lambda path: evil)
    try:
        error = _fetch_failure(receiver, srv.metadata)
        assert srv.requests == [f"/checkpoint/{STEP}/full"]
    finally:
        srv.close()
    _assert_rejected(error, marker, "failed authentication")
    assert "checkpoint key" in str(error) and "nothing of it was loaded" in str(error)


def test_hostile_pickle_signed_with_another_key_is_not_loaded(receiver, tmp_path):
    marker = tmp_path / "PWNED"
    evil = _torch_stream(_Evil(str(marker)))
    srv = Hostile(lambda path: _signed(evil, os.urandom(32), path))
    try:
        error = _fetch_failure(receiver, srv.metadata)
    finally:
        srv.close()
    _assert_rejected(error, marker, "does not match")


def test_hostile_pickle_signed_with_the_right_key_is_still_not_unpickled(tmp_path):
    """Defence in depth: even a payload that authenticates (a bug, a stolen key) is loaded with
    weights_only=True, which refuses the callable."""
    from hyperpod_lab.runtime.checkpointless.ft import bound_http_transport

    key = os.urandom(32)
    receiver = bound_http_transport("127.0.0.1", TIMEOUT, key=key)
    marker = tmp_path / "PWNED"
    evil = _torch_stream({"user": _Evil(str(marker))})
    srv = Hostile(lambda path: _signed(evil, key, path))
    try:
        error = _fetch_failure(receiver, srv.metadata)
    finally:
        srv.close()
        receiver.shutdown(wait=False)
    _assert_rejected(error, marker, "weights_only=True")


def test_state_of_another_job_tampered_torn_or_replayed_is_rejected(tmp_path):
    from hyperpod_lab.runtime.checkpointless.ft import bound_http_transport

    key = os.urandom(32)
    sender = bound_http_transport("127.0.0.1", TIMEOUT, key=key)
    other_job = bound_http_transport("127.0.0.1", TIMEOUT, key=os.urandom(32))
    receiver = bound_http_transport("127.0.0.1", TIMEOUT, key=key)
    marker = tmp_path / "never"  # nothing here can create it; _assert_rejected checks it anyway
    try:
        sender.send_checkpoint(dst_ranks=[1], step=STEP, state_dict=_real_state(), timeout=TIMEOUT)
        _assert_rejected(_fetch_failure(other_job, sender.metadata()), marker, "does not match")
        with urllib.request.urlopen(f"{sender.metadata()}{STEP}/full", timeout=10) as f:
            genuine = f.read()
        flipped = bytearray(genuine)
        flipped[len(flipped) // 2] ^= 0x01
        for label, body, step in [("one bit flipped", bytes(flipped), STEP), ("cut short", genuine[:-100], STEP),
                                  ("trailer only", genuine[-32:], STEP), ("empty", b"", STEP),
                                  ("step 3's state for step 4", genuine, STEP + 1)]:
            srv = Hostile(lambda path, body=body: body)
            try:
                error = _fetch_failure(receiver, srv.metadata, step)
            finally:
                srv.close()
            assert error is not None, label
            _assert_rejected(error, marker, "failed authentication")
        # the genuine bytes, proxied unchanged, load
        srv = Hostile(lambda path: genuine)
        try:
            got = receiver.recv_checkpoint(src_rank=0, metadata=srv.metadata, step=STEP, timeout=TIMEOUT)
        finally:
            srv.close()
        _same(_real_state(), got)
    finally:
        for t in (sender, other_job, receiver):
            t.shutdown(wait=False)

