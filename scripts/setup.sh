#!/usr/bin/env bash
# Everything the quickstart and the test suite need, on a fresh machine of this kind
# (Debian, Python 3.11, Node 20, root). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PIP_DISABLE_PIP_VERSION_CHECK=1
python=${PYTHON:-python3}

# Debian packages: Chromium for the browser tests (never a downloaded browser build), and
# openssh-server for the SSH engine's test hosts (scripts/ssh-hosts.sh; not started here).
missing=()
command -v chromium >/dev/null || missing+=(chromium)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} from Debian"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# torch is pinned here only (the package itself asks for torch>=2.3): exactly this version
# is on local disk as a CPU build; an open range would pull a multi-GB CUDA build.
if ! $python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  $python -m pip install -q torch==2.13.0 numpy
fi

# The front end first: the package ships the built panel.
bash scripts/build-labextension.sh

# Everything else from PyPI (already-satisfied requirements cost a few seconds).
$python -m pip install -q -e ".[test]" 2>&1 | { grep -v "as the 'root' user" || true; }
# An editable install does not put the wheel's data files into Jupyter's paths (a wheel
# does): link the built panel there, and enable the server extension the way the wheel does.
$python -m jupyter labextension develop --overwrite . >/dev/null
config_d="$($python -c 'import sys; print(sys.prefix)')/etc/jupyter/jupyter_server_config.d"
mkdir -p "$config_d" && cp jupyter-config/server-config/jupyter_dlc.json "$config_d/"
echo "setup: ready ($($python -c 'import torch; print("torch", torch.__version__)'))"
