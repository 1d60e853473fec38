#!/usr/bin/env bash
# Set up and run the whole test suite (real Slurm, sshd, torch.distributed; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -ra "$@"
