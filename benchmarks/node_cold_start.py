"""Cold start of the node-side processes: how long a fresh interpreter takes to import the
allocation's supervisor (``hyperpod_lab.node.supervisor``) and each node's health check
(``hyperpod_lab.node.health``), against ``import torch`` (what both paid before the node/ layout,
when ``hyperpod_lab.runtime/__init__`` imported torch eagerly) and a bare ``python -c pass``,
measured alternately in the same run.

    python benchmarks/node_cold_start.py [--runs 7] [--out benchmarks/results/node_cold_start.json]

Prints the median and best wall time of each (seconds) and the ratio of each node-side import to
``import torch``; writes the same as JSON.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks._common import write_results  # noqa: E402

CASES = {
    "python -c pass": "pass",
    "import torch (the former cost)": "import torch",
    "import hyperpod_lab.node.supervisor": "import hyperpod_lab.node.supervisor",
    "import hyperpod_lab.node.health": "import hyperpod_lab.node.health",
}
# each node-side case also checks that torch stayed unimported
CHECK = "\nimport sys\nassert {want} == ('torch' in sys.modules), 'torch imported: ' + repr({want})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "node_cold_start.json"))
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=REPO)
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(a.runs):  # alternate, so that load changes hit every case alike
        for name, code in CASES.items():
            code += CHECK.format(want="torch" in code)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, cwd="/", check=True)
            times[name].append(time.perf_counter() - t0)
    out = {"runs": a.runs, "load_avg": os.getloadavg(), "cases": {}}
    torch_median = sorted(times["import torch (the former cost)"])[a.runs // 2]
    for name, ts in times.items():
        ts.sort()
        med = ts[a.runs // 2]
        out["cases"][name] = {"median_s": round(med, 4), "best_s": round(ts[0], 4),
                              "ratio_to_import_torch": round(med / torch_median, 4)}
        print(f"{name:40s} median {med * 1000:8.1f} ms  best {ts[0] * 1000:8.1f} ms  "
              f"{med / torch_median:6.3f}x import torch")
    print(f"load average {out['load_avg'][0]:.2f}")
    return write_results(a.out, out)


if __name__ == "__main__":
    sys.exit(main())
