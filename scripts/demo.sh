#!/usr/bin/env bash
# The main job: set up, start the local dev cluster, run examples/quickstart.ipynb and then
# examples/flagship.ipynb headless against it, print the jobs' events as they arrive, a summary,
# and the flagship's side-by-side table (checkpoint-restart vs checkpointless, same fault) and
# elastic scaling events. Exit status 0 only if every job completed and checkpointless recovery
# read nothing from storage and had the lower downtime (docs/demo.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/hyperpod-lab demo --notebook examples/quickstart.ipynb "$@"
