#!/usr/bin/env bash
# Idempotent setup on a fresh Debian 12 machine (run as root, or with sudo available):
# Debian packages for the dev cluster, a Python 3.11 venv in .venv with hyperpod-lab (editable,
# with its test extras) and the built JupyterLab extension.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

APT_PKGS=(slurm-wlm munge openssh-server slurmdbd mariadb-server chromium)  # chromium: Debian's, for the Lab UI tests (never a downloaded browser)
APT_PKGS+=(iproute2 util-linux)  # ip, unshare, mount: the Kubernetes stand-in runs each pod in its own network, PID and mount namespaces (tests/k8s_standin.py)
command -v node >/dev/null && command -v npm >/dev/null || APT_PKGS+=(nodejs npm)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.hyperpod-lab-installed
if [ ! -f "$stamp" ] || [ -n "$(find pyproject.toml package.json yarn.lock src style -newer "$stamp" 2>/dev/null | head -n 1)" ]; then
  echo "setup: pip install -e .[test] (torch==2.13.0 CPU wheel, jupyterlab, ...)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
# The sagemaker-hyperpod SDK (test-only: tests/schedulers/test_eks_render.py validates rendered HyperPodPyTorchJobs
# against its model) pins its own versions and brings pytest plugins, so it lives in its own venv.
if [ ! -f .venv-sdk/.installed ]; then
  echo "setup: creating .venv-sdk with sagemaker-hyperpod==3.12.0 (~2 min, ~600 MB)"
  $PY -m venv .venv-sdk
  .venv-sdk/bin/python -m pip install -q "sagemaker-hyperpod==3.12.0"
  touch .venv-sdk/.installed
fi
echo "setup: done ($(.venv/bin/python -c 'import torch, hyperpod_lab; print("torch", torch.__version__, "hyperpod-lab", hyperpod_lab.__version__)'))"
