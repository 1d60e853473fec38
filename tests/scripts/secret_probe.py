"""Reports, in a step event, the SHA-256 of the variables named on its command line (never
their values), so a test can check that a secret reached the rank. Self-contained (staged alone)."""

import hashlib
import os
import sys

import hyperpod_lab.runtime as hp

with hp.init() as ctx:
    ctx.step(0, loss=0.0, **{f"sha256_{k}": hashlib.sha256(os.environ.get(k, "").encode()).hexdigest()
                             for k in sys.argv[1:]}, **{f"has_{k}": k in os.environ for k in sys.argv[1:]})
