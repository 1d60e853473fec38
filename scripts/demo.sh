#!/usr/bin/env bash
# The main job: set up, start the local dev cluster, run examples/quickstart.ipynb headless
# against it and print the job's events as they arrive, then a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/hyperpod-lab demo --notebook examples/quickstart.ipynb "$@"
