"""Three steps of nothing under the runtime: a job that starts, reports and finishes in a
second or two, for tests of the job lifecycle (the script is staged alone: no local imports)."""

import time

import hyperpod_lab.runtime as hp

with hp.init() as ctx:
    for step in range(3):
        time.sleep(0.2)
        ctx.step(step, loss=1.0 / (step + 1))
