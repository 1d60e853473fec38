"""A training script whose every start fails: it raises before its first step (a bad config,
a missing file, a broken node). Under ``hyperpod_lab.runtime`` the exception is recorded, so the
launch agent reports its last line as the fault's reason, the same on every restart.
``--after-steps N`` fails after N steps instead (each start gets no further: no progress).
"""

import argparse
import time

import hyperpod_lab.runtime as hp

p = argparse.ArgumentParser()
p.add_argument("--after-steps", type=int, default=0)
p.add_argument("--sleep", type=float, default=0.05)
a = p.parse_args()

with hp.init() as ctx:
    for step in range(a.after_steps):
        time.sleep(a.sleep)
        ctx.step(step, loss=1.0)
    raise RuntimeError(f"always fails: this run cannot train (after {a.after_steps} steps)")
