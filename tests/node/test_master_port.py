"""The workers' MASTER_PORT comes from below Linux's ephemeral range.

torch's default (``get_free_port``: bind port 0, close, hand the number to rank 0) picks an
ephemeral port that any outgoing connection may take before rank 0 binds it; a fresh-clone CI run
saw a fair local DDP job's rank 0 fail with EADDRINUSE on port 33351. Ephemeral range: Linux's
``net.ipv4.ip_local_port_range`` (Documentation/networking/ip-sysctl.rst), read here.
"""

import os
import socket
import subprocess
import sys

from hyperpod_lab.node.launch import MASTER_PORT_BAND, free_master_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_free_master_port_is_below_the_ephemeral_range_and_skips_listeners():
    lo, hi = MASTER_PORT_BAND
    assert hi < _ephemeral_low()
    with socket.socket() as held:
        held.bind(("", lo))  # the band's only port taken: the probe must not hand it out
        held.listen()
        assert free_master_port((lo, lo + 1)) == lo + 1
        try:
            free_master_port((lo, lo))
        except OSError as e:
            assert "no free TCP port" in str(e)
        else:
            raise AssertionError("a band whose only port is taken must raise")


def test_workers_of_a_standalone_launch_get_a_master_port_in_the_band(tmp_path):
    script = tmp_path / "show_port.py"
    script.write_text("import os\nopen(os.path.join(os.path.dirname(__file__), 'port-' + os.environ['RANK']), 'w')"
                      ".write(os.environ['MASTER_PORT'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPOD_LAB_")}
    env["PYTHONPATH"] = REPO
    r = subprocess.run([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node", "2",
                        str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    ports = {int((tmp_path / f"port-{rank}").read_text()) for rank in (0, 1)}
    assert len(ports) == 1
    port = ports.pop()
    assert MASTER_PORT_BAND[0] <= port <= MASTER_PORT_BAND[1] < _ephemeral_low()
