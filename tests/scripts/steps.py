"""Steps of nothing under the runtime: a job that starts, reports ``--steps`` steps
``--sleep`` seconds apart and finishes, for tests of the job lifecycle (the backends stage the
script file alone: no local imports)."""

import argparse
import time

import hyperpod_lab.runtime as hp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--sleep", type=float, default=0.2)
a = p.parse_args()

with hp.init() as ctx:
    for step in range(a.steps):
        time.sleep(a.sleep)
        ctx.step(step, loss=1.0 / (step + 1))
