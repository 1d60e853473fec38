#!/usr/bin/env bash
# Set up and run the whole test suite (real Slurm, sshd, torch.distributed; see README), after the
# linters: ruff over the Python (pyproject's [tool.ruff]) and the TypeScript compiler's strict checks
# (tsconfig.json) over src/. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test.sh: ruff check"
.venv/bin/ruff check .
echo "test.sh: tsc --noEmit (strict)"
[ -x node_modules/.bin/tsc ] || PATH="$PWD/.venv/bin:$PATH" jlpm install
node_modules/.bin/tsc --noEmit -p .
exec .venv/bin/python -m pytest -ra --durations=40 -n 2 --dist loadgroup "$@"
