"""The server's cursor store (``hyperpod_lab.server.cursors``): big cursors become short tokens
that resolve to exactly the cursor they stand for, in this process and after a restart (real
files in a tmp directory); small and old-form cursors stay as they were."""

from __future__ import annotations

import pytest

from hyperpod_lab.errors import SpecError
from hyperpod_lab.events import encode_cursor
from hyperpod_lab.server.cursors import CHAIN_MIN, TOKEN_MAX_CHARS, CursorStore


def _big(n: int, base: int = 1000) -> dict[str, int]:
    return {f"rank-{r}.jsonl": base + r for r in range(n)}


def test_small_cursors_keep_the_old_form_and_old_forms_are_accepted(tmp_path):
    store = CursorStore(str(tmp_path))
    small = _big(3)
    assert store.issue("j", small) == encode_cursor(small)
    assert store.resolve("j", encode_cursor(small)) == small
    assert store.resolve("j", encode_cursor(_big(2048))) == _big(2048)  # an old big one, if a client sends it
    assert store.resolve("j", None) == {} and store.resolve("j", "") == {}
    with pytest.raises(SpecError) as e:
        store.resolve("j", "!!")
    assert e.value.field == "cursor"


def test_a_big_cursor_is_a_short_token_that_survives_a_restart(tmp_path):
    store = CursorStore(str(tmp_path))
    big = _big(2048, 10**5)
    token = store.issue("job-a", big)
    assert len(token) <= TOKEN_MAX_CHARS and len(encode_cursor(big)) > 65536
    assert store.issue("job-a", big) == token  # the same cursor: the same root
    assert store.resolve("job-a", token) == big
    again = CursorStore(str(tmp_path))  # a restarted server
    assert again.resolve("job-a", token) == big
    with pytest.raises(SpecError, match="another job"):
        again.resolve("job-b", token)
    with pytest.raises(SpecError, match="no longer holds"):
        CursorStore(str(tmp_path / "other")).resolve("job-a", token)
    with pytest.raises(SpecError):
        again.resolve("job-a", token + "/../x")


def test_a_chain_gives_each_delivery_its_own_token(tmp_path):
    store = CursorStore(str(tmp_path))
    chain = store.chain("job-a")
    cur = _big(40, 0)
    tokens, states = [], []
    n = CHAIN_MIN + 300  # past one chain's length: a second root
    for i in range(n):
        name = f"rank-{i % 40}.jsonl"
        cur[name] += 10
        tokens.append(chain.advance(cur, name, cur[name]))
        states.append(dict(cur))
    assert max(len(t) for t in tokens) <= TOKEN_MAX_CHARS
    assert len({t.split(".")[1] for t in tokens}) == 2  # two roots
    for i in (0, 1, 17, CHAIN_MIN - 1, CHAIN_MIN, n - 1):
        assert store.resolve("job-a", tokens[i]) == states[i], i
    chain.flush()  # (a subscriber that ends)
    again = CursorStore(str(tmp_path))
    for i in (0, 1, 17, CHAIN_MIN - 1, CHAIN_MIN, n - 1):
        assert again.resolve("job-a", tokens[i]) == states[i], i


def test_a_chain_token_not_yet_written_resolves_behind_never_ahead(tmp_path):
    """After a crash, a token whose deliveries were not written yet resolves to the last one
    written: the client gets those events again, never fewer."""
    store = CursorStore(str(tmp_path))
    chain = store.chain("job-a")
    cur = _big(40, 0)
    tokens = []
    for i in range(10):
        name = f"rank-{i}.jsonl"
        cur[name] += 10
        tokens.append(chain.advance(cur, name, cur[name]))
    crashed = CursorStore(str(tmp_path))  # nothing flushed since the root: only the root is on disk
    got = crashed.resolve("job-a", tokens[-1])
    assert all(got[k] <= cur[k] for k in cur) and got == crashed.resolve("job-a", tokens[0])
