"""``python -m hyperpod_lab.schedulers._local_wrapper JOB_DIR -- ARGV...``: run ARGV, then write
its exit code to ``JOB_DIR/exit_code`` atomically. SIGTERM is passed on to ARGV."""

import os
import signal
import subprocess
import sys

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.jobdir import JobPaths


def main() -> int:
    job_dir, sep, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    assert sep == "--" and argv, "usage: _local_wrapper JOB_DIR -- ARGV..."
    os.umask(0o077)  # what the job writes is private to the user, as on Slurm
    paths = JobPaths(job_dir, join=os.path.join)
    with open(paths.native_id, "w") as f:  # the local backend's native id is this process's pid
        f.write(f"{os.getpid()}\n")
    p = subprocess.Popen(argv)
    signal.signal(signal.SIGTERM, lambda *_: p.send_signal(signal.SIGTERM))
    code = p.wait()
    code = 128 - code if code < 0 else code
    write_atomic(paths.exit_code, f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
