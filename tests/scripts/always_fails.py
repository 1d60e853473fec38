"""A training script whose every start fails: it raises before its first step (a bad config,
a missing file, a broken node). Under ``hyperpod_lab.runtime`` the exception is recorded, so the
launch agent reports its last line as the fault's reason, the same on every restart.
"""

import hyperpod_lab.runtime as hp

with hp.init():
    raise RuntimeError("always fails: this run cannot train (after 0 steps)")
