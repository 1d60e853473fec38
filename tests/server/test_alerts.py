"""Alerts when away (issue 29 item 3): the rules over the job facts fold, the settings file, and
the webhook sender against a real HTTP receiver on loopback (retries, once per alert across a
restart, the bounded queue, no secret in a message or a log line)."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest
from webhook_receiver import TOKEN, Receiver

from hyperpod_lab.errors import ConfigError
from hyperpod_lab.events import Event
from hyperpod_lab.fold.facts import fold
from hyperpod_lab.server import redact
from hyperpod_lab.server.alerts import Alert, Alerts, load_settings
from hyperpod_lab.submit.jobs import JobRecord


def _record(status="running", **kw) -> JobRecord:
    d = dict(job_id="proto-20261127-000000-00aa", name="proto", cluster="local", orchestrator="local",
             native_id="1", job_dir="/tmp/x", spec={"script": "train.py"}, status=status)
    d.update(kw)
    return JobRecord(**d)


def _events(t0: float) -> list[Event]:
    """A job that steps, loses rank 1 at t0+10 (detected at t0+11), recovers (first step after it
    at t0+41: 30 s down) and has rank 1 flagged as a straggler at t0+50."""
    jid = "proto-20261127-000000-00aa"
    evs = [Event("started", jid, t0, "rank-0", 0, {})]
    evs += [Event("step", jid, t0 + 1 + s, "rank-0", 1 + s, {"step": s, "loss": 1.0}) for s in range(9)]
    evs.append(Event("fault.detected", jid, t0 + 11, "agent-n1", 0, {"rank": 1, "reason": "exit"}))
    evs.append(Event("recovery.completed", jid, t0 + 41, "rank-0", 10, {"restart_count": 1, "downtime_s": 30.0}))
    evs.append(Event("step", jid, t0 + 42, "rank-0", 11, {"step": 9, "loss": 0.9}))
    evs.append(Event("straggler.detected", jid, t0 + 50, "agent-n1", 1,
                     {"rank": 1, "node": "n2", "step_s": 1.5, "median_step_s": 1.0, "window": 5}))
    return evs


def _settings(tmp_path, url: str, rules: str, extra: str = "") -> str:
    path = tmp_path / "alerts.toml"
    path.write_text(f'[webhook]\nurl = "{url}"\nbackoff_s = 0.05\n{extra}\n{rules}')
    os.chmod(path, 0o600)
    return str(path)


ALL_RULES = """
[[rules]]
on = "job_failed"
[[rules]]
on = "fault"
[[rules]]
on = "slow_recovery"
seconds = 20
[[rules]]
name = "very-slow"
on = "slow_recovery"
seconds = 60
[[rules]]
on = "low_goodput"
percent = 90
[[rules]]
on = "straggler"
[[rules]]
name = "other-cluster"
on = "fault"
clusters = ["hp-slurm"]
"""


def test_rules_over_the_job_facts(tmp_path):
    t0 = 1.8e9
    settings = load_settings(_settings(tmp_path, "https://hooks.example.com/services/abc/def/ghi", ALL_RULES))
    facts = fold(_events(t0))
    from hyperpod_lab.server.alerts import evaluate

    got = {a.key: a for a in evaluate(settings.rules, _record(), facts, now=t0 + 60)}
    jid = "proto-20261127-000000-00aa"
    assert set(got) == {f"fault|{jid}|incident:0", f"slow_recovery|{jid}|incident:0",
                        f"straggler|{jid}|straggler:1:{t0 + 50}"}, sorted(got)
    assert "fault 1 detected after step 8" in got[f"fault|{jid}|incident:0"].text
    assert "took 30.0 s to recover" in got[f"slow_recovery|{jid}|incident:0"].text
    assert got[f"fault|{jid}|incident:0"].at == t0 + 11
    # the same from the saved progress (what a restarted server has) gives the same alerts
    assert {a.key for a in evaluate(settings.rules, _record(), facts.to_dict(), now=t0 + 60)} == set(got)
    # an incident still down past the threshold: slow_recovery fires before the recovery
    open_facts = fold(_events(t0)[:11])
    keys = {a.key for a in evaluate(settings.rules, _record(), open_facts, now=t0 + 11 + 25)}
    assert f"slow_recovery|{jid}|incident:0" in keys and f"very-slow|{jid}|incident:0" not in keys
    # failed job; low goodput; a reason with a credential in it is redacted
    failed = _record("failed", exit_code=3, reason="NonZeroExitCode https://x.example/?token=abc123")
    texts = {a.key: a.text for a in evaluate(settings.rules, failed, facts, goodput=0.5, now=t0 + 60)}
    assert "exit code 3" in texts[f"job_failed|{jid}|failed"] and "abc123" not in texts[f"job_failed|{jid}|failed"]
    assert "goodput 50.0 %" in texts[f"low_goodput|{jid}|goodput"]
    assert not any(k.startswith("other-cluster|") for k in texts)


def test_settings_errors_name_the_field_and_never_the_url(tmp_path):
    secret = "https://hooks.example.com/services/T/B/sekrit-value-123"
    bad = [("[webhook]\n", "exactly one of url_env"),
           (f'[webhook]\nurl = "{secret}"\n[[rules]]\non = "oops"\n', "on = 'oops'"),
           (f'[webhook]\nurl = "{secret}"\n[[rules]]\non = "slow_recovery"\n', "set seconds"),
           (f'[webhook]\nurl = "{secret}"\n[[rules]]\non = "low_goodput"\npercent = 120\n', "percent must be"),
           ('[webhook]\nurl = "ftp://sekrit-value-123/x"\n', "not an http(s) URL"),
           ('[webhook]\nurl_env = "HYPERPOD_NO_SUCH_VAR_XYZ"\n', "HYPERPOD_NO_SUCH_VAR_XYZ"),
           (f'[webhook]\nurl = "{secret}"\n[[rules]]\non = "fault"\n[[rules]]\non = "fault"\n', "second rule")]
    for text, expect in bad:
        p = tmp_path / "alerts.toml"
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_settings(str(p), environ={})
        assert expect in str(e.value) and "sekrit-value-123" not in str(e.value), str(e.value)
    assert load_settings(str(tmp_path / "none.toml")) is None
    p.write_text('[webhook]\nurl_env = "MY_HOOK"\n[[rules]]\non = "fault"\n')
    s = load_settings(str(p), environ={"MY_HOOK": secret})
    assert s.webhook.url == secret and secret not in repr(s)


def _wait(cond, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_webhook_retries_then_delivers_once_across_a_restart(tmp_path, caplog):
    recv = Receiver(answers=[500, 500])
    try:
        settings = load_settings(_settings(tmp_path, recv.url, '[[rules]]\non = "job_failed"\n'))
        sent = str(tmp_path / "data" / "alerts-sent.json")
        alerts = Alerts(settings, sent_path=sent).start()
        alert = Alert("job_failed|j1|failed", "hyperpod-lab: job j1 failed", time.time() + 1)
        with caplog.at_level(logging.INFO, logger="hyperpod_lab.server"):
            assert alerts.offer([alert]) == 1
            assert alerts.offer([alert]) == 0  # queued already
            assert _wait(lambda: alerts.delivered == 1)
            assert alerts.offer([alert]) == 0  # sent already
            time.sleep(0.3)
        alerts.stop()
        assert recv.statuses() == [500, 500, 200]
        assert recv.delivered() == ["hyperpod-lab: job j1 failed"]
        status, path, headers, body = recv.posts[-1]
        assert json.loads(body) == {"text": "hyperpod-lab: job j1 failed"}
        assert headers["Content-Type"] == "application/json"
        # the retries were logged, without the URL or its token (the redacting filter's job for
        # any other line: the URL was given to redact.add_secret)
        retry_lines = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert len(retry_lines) == 2 and all(TOKEN not in ln and recv.url not in ln for ln in retry_lines)
        assert redact.redact(f"posting to {recv.url} failed") == "posting to [secret] failed"
        saved = json.loads(open(sent).read())
        assert saved["sent"]["job_failed|j1|failed"]["result"] == "delivered"
        assert TOKEN not in open(sent).read()
        assert oct(os.stat(sent).st_mode & 0o777) == "0o600"
        # a restarted server (a new Alerts over the same file) does not send it again
        again = Alerts(settings, sent_path=sent).start()
        assert again.offer([alert]) == 0
        # an occurrence from before the sent file began is never sent
        assert again.offer([Alert("fault|j0|incident:0", "old", saved["since"] - 5)]) == 0
        again.stop()
        assert len(recv.posts) == 3
    finally:
        recv.close()


def test_webhook_gives_up_on_4xx_and_bounded_queue(tmp_path):
    recv = Receiver(answers=[404])
    try:
        settings = load_settings(_settings(tmp_path, recv.url, '[[rules]]\non = "fault"\n', "queue = 2\n"))
        alerts = Alerts(settings, sent_path=str(tmp_path / "sent.json"))  # not started: nothing drains
        batch = [Alert(f"fault|j{i}|incident:0", f"fault {i}", time.time() + 1) for i in range(5)]
        assert alerts.offer(batch) == 2 and alerts.dropped == 3
        alerts.start()
        assert _wait(lambda: alerts.delivered + alerts.failed == 2)
        # the ones the full queue refused come again at the next evaluation and go then
        assert alerts.offer(batch) == 2
        assert _wait(lambda: alerts.delivered + alerts.failed == 4)
        assert alerts.offer(batch) == 1
        assert _wait(lambda: alerts.delivered + alerts.failed == 5)
        alerts.stop()
        assert recv.statuses() == [404, 200, 200, 200, 200]  # a 404 is not retried
        assert alerts.failed == 1 and alerts.offer(batch) == 0  # nor sent again
        assert sorted(recv.delivered()) == [f"fault {i}" for i in range(1, 5)]
    finally:
        recv.close()
