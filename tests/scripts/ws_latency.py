"""A Lab sidebar's event stream, as its own process (test helper): connect to a jupyter server's
``/hyperpod/jobs/<job_id>/stream`` and record each live event's delivery latency, its arrival
here minus its ``time`` (stamped by its writer when it wrote it; same host, same clock).

Usage: ws_latency.py URL TOKEN JOB_ID OUT.json

Prints ``open`` on stdout once the socket is open; events stamped before that are the replayed
history and are not counted. Stops at the stream's ``end`` message or SIGTERM and writes
``{"opened": t, "latencies": [[seconds, kind, writer], ...], "error": str | null}`` to OUT.json.
A process of its own so that the test's own polling (paramiko, the GIL) does not delay the
receive and inflate the numbers.
"""

import json
import signal
import sys
import time

import websocket


def main() -> int:
    url, token, job_id, out = sys.argv[1:5]
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    ws = websocket.create_connection(url.replace("http", "ws", 1) + f"/hyperpod/jobs/{job_id}/stream",
                                     header=[f"Authorization: token {token}"], timeout=60)
    ws.settimeout(0.5)
    opened = time.time()
    print("open", flush=True)
    latencies, error = [], None
    try:
        while not stop["now"]:
            try:
                raw = ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            now = time.time()
            m = json.loads(raw)
            if m.get("type") == "event" and m["event"]["time"] >= opened:
                latencies.append([now - m["event"]["time"], m["event"]["kind"], m["event"]["writer"]])
            elif m.get("type") == "end":
                break
    except Exception as e:  # written to OUT for the test to report
        error = repr(e)
    finally:
        ws.close()
        with open(out, "w") as f:
            json.dump({"opened": opened, "latencies": latencies, "error": error}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
