"""Server load (issue 13, findings 3 and 4): memory, responsiveness and event latency of the
jupyter-server extension with many jobs, a huge job, many tabs and stalled WebSockets.

What runs (all real): a jupyter-server with the hyperpod_lab extension on loopback (token auth),
the local backend, event files on disk, WebSocket clients (websocket-client) in threads.

* **baseline** (same run, own server and store): 1 tracked job, 1 tab.
* **load**: ``--jobs`` (1,000) tracked running jobs (records in the store, 10 events each), one
  more with ``--events`` (1,000,000) events, ``--tabs`` (50) WebSockets: one replays the big
  job from its first event, the others each follow a small job; ``--stalled`` (30) WebSockets on
  the big job that never read.

For ``--window`` seconds an appender writes a ``step`` event every 0.1 s to a followed job
(round robin; to the one job in the baseline) and a client asks ``GET /api/status`` every
0.05 s. Measured: the server's RSS (peak of samples every 0.25 s), ``/api/status`` p50/p99,
event latency p50/p99 (append -> received by a live subscriber). Bounds: RSS < 400 MB,
``/api/status`` p99 < 500 ms, event p99 < 1.5 s.

Writes ``benchmarks/results/server_load.json`` (``server_load_quick.json`` with ``--quick``).
Run: ``.venv/bin/python benchmarks/server_load.py`` (``--quick``: 200 jobs, 100k events, 10 tabs,
5 stalled, a 10 s window: a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
_TMP = tempfile.mkdtemp(prefix="hyperpod-lab-bench-load-")
os.environ["HYPERPOD_LAB_CONFIG"] = os.path.join(_TMP, "clusters.toml")

from benchmarks._common import server_rss_mb, start_jupyter_server, track_local_job, write_events, write_results  # noqa: E402

BOUNDS = {"rss_mb": 400.0, "status_p99_s": 0.5, "event_p99_s": 1.5}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * len(xs))) - 1))]


def make_jobs(data_dir: str, jobs: int, big_events: int) -> tuple[list, object | None]:
    """``jobs`` small running jobs (10 events each) and, if ``big_events``, one with that many."""
    from hyperpod_lab.submit.jobs import JobStore

    store = JobStore(os.path.join(data_dir, "jobs"))
    small = []
    for i in range(jobs):
        d = os.path.join(data_dir, "jobdirs", f"small-{i}")
        rec = track_local_job(d, f"small-{i}", store)
        write_events(d, rec.job_id, 10, t0=time.time() - 60)
        small.append(rec)
    big = None
    if big_events:
        d = os.path.join(data_dir, "jobdirs", "big")
        big = track_local_job(d, "big", store)
        write_events(d, big.job_id, big_events, t0=time.time() - big_events / 1000 - 60)
    return small, big


def ws_connect(url: str, token: str, path: str, timeout_s: float = 60.0):
    import websocket

    return websocket.create_connection(url.replace("http", "ws", 1) + path, header=[f"Authorization: token {token}"],
                                       timeout=timeout_s)


def run_phase(name: str, jobs: int, big_events: int, tabs: int, stalled: int, window_s: float) -> dict:
    data_dir = os.path.join(_TMP, name)
    os.environ["HYPERPOD_LAB_DATA_DIR"] = data_dir  # for the store written here; the server gets it too
    t0 = time.monotonic()
    small, big = make_jobs(data_dir, jobs, big_events)
    print(f"[{name}] {jobs} jobs + {big_events} events written in {time.monotonic() - t0:.1f} s", flush=True)
    work = os.path.join(_TMP, name + "-server")
    os.makedirs(work)
    proc, url, token = start_jupyter_server(work, work, {"HYPERPOD_LAB_DATA_DIR": data_dir})
    stop = threading.Event()
    latencies: list[float] = []
    status_lat: list[float] = []
    rss: list[float] = []
    replayed = [0]
    errors: list[str] = []
    socks = []
    try:
        followed = small[:max(1, tabs - (1 if big else 0))]
        threads = []

        def tab(job_id: str, what: str, on_event) -> None:
            """One subscriber reading a job's stream until ``stop``; ``on_event(message)`` per event."""
            try:
                ws = ws_connect(url, token, f"/hyperpod/jobs/{job_id}/stream")
                socks.append(ws)
                ws.settimeout(1.0)
                while not stop.is_set():
                    try:
                        m = json.loads(ws.recv())
                    except Exception as e:
                        if type(e).__name__ == "WebSocketTimeoutException":
                            continue
                        raise
                    if m["type"] == "event":
                        on_event(m)
            except Exception as e:
                if not stop.is_set():
                    errors.append(f"{what}: {e!r}")

        def on_live(m):
            if m["event"]["data"].get("bench"):
                latencies.append(time.time() - m["event"]["time"])

        def on_replayed(m):
            replayed[0] += 1

        for rec in followed:
            threads.append(threading.Thread(target=tab, args=(rec.job_id, f"tab on {rec.job_id}", on_live),
                                            daemon=True))
        if big is not None and tabs > 1:
            threads.append(threading.Thread(target=tab, args=(big.job_id, "replay tab", on_replayed), daemon=True))
        for th in threads:
            th.start()
        for _ in range(stalled):  # never read; a small receive buffer so the server sees it
            ws = ws_connect(url, token, f"/hyperpod/jobs/{big.job_id}/stream")
            ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            socks.append(ws)
        time.sleep(2.0)  # the tabs got their first messages

        def ask_status():
            while not stop.is_set():
                t = time.monotonic()
                req = urllib.request.Request(url + "/api/status", headers={"Authorization": f"token {token}"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        r.read()
                    status_lat.append(time.monotonic() - t)
                except OSError as e:
                    errors.append(f"/api/status: {e!r}")
                time.sleep(0.05)

        def sample_rss():
            while not stop.is_set():
                rss.append(server_rss_mb(proc.pid))
                time.sleep(0.25)

        from hyperpod_lab.events import EventWriter

        writers = [EventWriter(r.job_dir, "bench", r.job_id) for r in followed]
        aux = [threading.Thread(target=ask_status, daemon=True), threading.Thread(target=sample_rss, daemon=True)]
        for th in aux:
            th.start()
        end, i = time.monotonic() + window_s, 0
        while time.monotonic() < end:
            writers[i % len(writers)].emit("step", step=1000 + i, bench=True)
            i += 1
            time.sleep(0.1)
        time.sleep(2.0)  # the last events arrive
        stop.set()
        for th in aux:
            th.join(timeout=60)
        result = {
            "jobs": jobs + (1 if big else 0), "big_job_events": big_events, "tabs": tabs, "stalled": stalled,
            "window_s": window_s, "appended": i, "received": len(latencies),
            "rss_mb_peak": max(rss), "rss_mb_end": rss[-1],
            "status_p50_s": pct(status_lat, 0.5), "status_p99_s": pct(status_lat, 0.99),
            "status_max_s": max(status_lat) if status_lat else None, "status_requests": len(status_lat),
            "event_p50_s": pct(latencies, 0.5), "event_p99_s": pct(latencies, 0.99),
            "replayed_events": replayed[0], "errors": errors[:10],
        }
        print(f"[{name}] " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                        for k, v in result.items() if k != "errors"}), flush=True)
        return result
    finally:
        stop.set()
        for ws in socks:
            try:
                ws.close(timeout=1)
            except Exception:
                pass
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 jobs, 100k events, 10 tabs, 5 stalled, 10 s")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--tabs", type=int, default=50)
    ap.add_argument("--stalled", type=int, default=30)
    ap.add_argument("--window", type=float, default=30.0)
    a = ap.parse_args(argv)
    if a.quick:
        a.jobs, a.events, a.tabs, a.stalled, a.window = 200, 100_000, 10, 5, 10.0
    try:
        base = run_phase("baseline", 1, 0, 1, 0, a.window)
        load = run_phase("load", a.jobs, a.events, a.tabs, a.stalled, a.window)
    finally:
        shutil.rmtree(_TMP, ignore_errors=True)
    ratios = {k: (load[k] / base[k] if load.get(k) and base.get(k) else None)
              for k in ("rss_mb_peak", "status_p50_s", "status_p99_s", "event_p50_s", "event_p99_s")}
    met = {"rss_mb": load["rss_mb_peak"] < BOUNDS["rss_mb"],
           "status_p99_s": load["status_p99_s"] is not None and load["status_p99_s"] < BOUNDS["status_p99_s"],
           "event_p99_s": load["event_p99_s"] is not None and load["event_p99_s"] < BOUNDS["event_p99_s"]}
    out = {"quick": a.quick, "cpus": os.cpu_count(), "baseline": base, "load": load, "ratios": ratios,
           "bounds": BOUNDS, "met": met}
    print("ratios load/baseline: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None))
    for k, ok in met.items():
        got = load["rss_mb_peak"] if k == "rss_mb" else load[k]
        print(f"bound {k} < {BOUNDS[k]}: {'met' if ok else 'MISSED'} ({got})")
    write_results(os.path.join(REPO, "benchmarks", "results", "server_load_quick.json" if a.quick else "server_load.json"),
                  out, said="wrote")
    return out


if __name__ == "__main__":
    main()
