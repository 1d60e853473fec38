"""A cluster profile's own webhook (issue 29, item 3: "URL from the profile or user settings"):
``alerts_webhook_url_env`` in ``[clusters.X]`` names an environment variable of the server that
holds the URL; that cluster's jobs alert there, the other clusters' to ``alerts.toml``'s
``[webhook]``. Two real HTTP receivers on loopback (tests/server/webhook_receiver.py); the log
lines are checked for the URLs and their token."""

from __future__ import annotations

import logging
import time

import tomli_w
from webhook_receiver import TOKEN, Receiver

from hyperpod_lab.server import redact
from hyperpod_lab.server.alerts import Alerts, setup_alerts
from hyperpod_lab.server.watch.watcher import Watcher
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobRecord, JobStore


def _failed(job_id: str, cluster: str) -> JobRecord:
    return JobRecord(job_id=job_id, name=job_id.split("-")[0], cluster=cluster, orchestrator="slurm", native_id="7",
                     job_dir="/fsx/x", spec={"script": "train.py"}, status="failed", exit_code=1,
                     updated_at=time.time() + 1)


def _wait(cond, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not cond():
        time.sleep(0.05)
    return cond()


def test_a_clusters_jobs_alert_to_its_profiles_webhook_and_no_secret_is_logged(tmp_path, monkeypatch, caplog):
    default, team = Receiver(), Receiver(answers=[500])
    try:
        base = {"orchestrator": "slurm", "host": "login", "shared_root": "/fsx"}
        config = tmp_path / "clusters.toml"
        config.write_text(tomli_w.dumps({"clusters": {
            "team-a": {**base, "alerts_webhook_url_env": "TEAM_A_WEBHOOK"},
            "team-b": base,
            "team-c": {**base, "alerts_webhook_url_env": "TEAM_C_WEBHOOK_UNSET"}}}))
        monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(config))
        monkeypatch.setenv("HYPERPOD_LAB_DATA_DIR", str(tmp_path / "data"))  # the sent file
        team_url = team.url.replace("127.0.0.1", "localhost")  # another URL than the default's
        monkeypatch.setenv("TEAM_A_WEBHOOK", team_url)
        monkeypatch.delenv("TEAM_C_WEBHOOK_UNSET", raising=False)
        alerts_file = tmp_path / "alerts.toml"
        alerts_file.write_text(f'[webhook]\nurl = "{default.url}"\nbackoff_s = 0.05\n[[rules]]\non = "job_failed"\n')
        alerts_file.chmod(0o600)

        watcher = Watcher(Client(JobStore(str(tmp_path / "jobs"))))  # the server's, not started: no job tracked

        with caplog.at_level(logging.INFO, logger="hyperpod_lab"):
            alerts = setup_alerts(str(alerts_file), watcher)
            try:
                assert isinstance(alerts, Alerts) and alerts in watcher.observers
                # the watcher's status tick with one failed job on each cluster
                alerts.on_status([_failed("a-1", "team-a"), _failed("b-1", "team-b"), _failed("c-1", "team-c")], {})
                assert _wait(lambda: alerts.delivered == 2 and alerts.failed == 1), (alerts.delivered, alerts.failed)
            finally:
                alerts.stop()
        # team-a's job went to its profile's receiver (after one retry), team-b's to the file's
        assert team.statuses() == [500, 200] and len(team.delivered()) == 1 and "a-1" in team.delivered()[0]
        assert len(default.delivered()) == 1 and "b-1" in default.delivered()[0], default.delivered()
        # team-c's variable is not set: its alert failed, named the variable, went nowhere
        assert alerts.state["sent"]["job_failed|c-1|failed"]["result"].startswith("failed:")
        assert "TEAM_C_WEBHOOK_UNSET" in alerts.state["sent"]["job_failed|c-1|failed"]["result"]
        lines = [r.getMessage() for r in caplog.records]
        assert any("TEAM_C_WEBHOOK_UNSET" in ln and "not set" in ln for ln in lines), lines
        assert any("retrying" in ln for ln in lines), lines  # the retry to team-a's webhook was logged ...
        for secret in (TOKEN, team_url, default.url):  # ... without a URL or its token
            assert not [ln for ln in lines if secret in ln], secret
            if secret != TOKEN:
                assert redact.redact(f"x {secret} y") == "x [secret] y"
        assert redact.redact(f"GET /services/{TOKEN}") == "GET [secret]"  # the path alone too
        assert TOKEN not in (tmp_path / "data" / "alerts-sent.json").read_text()
    finally:
        default.close()
        team.close()


def test_profile_url_errors_never_show_the_value(tmp_path, monkeypatch):
    import pytest

    from hyperpod_lab.errors import ConfigError
    from hyperpod_lab.server.alerts import profile_webhook_url

    config = tmp_path / "clusters.toml"
    config.write_text(tomli_w.dumps({"clusters": {"hp": {"orchestrator": "slurm", "host": "login", "shared_root": "/fsx",
                                                         "alerts_webhook_url_env": "HP_HOOK"}}}))
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(config))
    with pytest.raises(ConfigError) as e:
        profile_webhook_url("hp", environ={"HP_HOOK": "ftp://sekrit-value-9876/x"})
    assert "HP_HOOK" in str(e.value) and "sekrit-value-9876" not in str(e.value)
    assert profile_webhook_url("no-such-cluster", environ={}) is None  # the file's URL applies
    assert profile_webhook_url("hp", environ={"HP_HOOK": "https://hooks.example.com/services/T/B/c0ffee"}) \
        == "https://hooks.example.com/services/T/B/c0ffee"
