#!/usr/bin/env bash
# Set up and run the whole test suite (real Slurm, sshd, torch.distributed; see README), after the
# linters: ruff over the Python (pyproject's [tool.ruff]) and the TypeScript compiler's strict checks
# (tsconfig.json) over src/. Extra arguments go to pytest (one run); with none, the whole suite
# runs in two: everything on two workers, then the two tests of many torch processes alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test.sh: ruff check"
.venv/bin/ruff check .
echo "test.sh: tsc --noEmit (strict)"
[ -x node_modules/.bin/tsc ] || PATH="$PWD/.venv/bin:$PATH" jlpm install
node_modules/.bin/tsc --noEmit -p .
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -ra --durations=40 -n 2 --dist loadgroup "$@"
fi
# The 16-node x 2-process dev-cluster job (34 torch processes on this host) and the 2 x 8-rank FSDP
# job (16) run alone, after the rest: beside the 16-node job, the other worker's timing-sensitive
# jobs (a quorum's join timeout, a Lighthouse start) saw a host at load ~30 and failed (a local
# checkpointless step committed by one group).
SOLO=(tests/runtime/test_scale16_slurm.py tests/runtime/test_shape8.py)
rc=0
.venv/bin/python -m pytest -ra --durations=40 -n 2 --dist loadgroup "${SOLO[@]/#/--ignore=}" || rc=$?
echo "test.sh: ${SOLO[*]} alone"
.venv/bin/python -m pytest -ra --durations=5 -p no:xdist "${SOLO[@]}" || rc=$?
exit "$rc"
