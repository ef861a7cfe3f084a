#!/usr/bin/env bash
# Build the JupyterLab panel (labextension/) into jupyter_dlc/labextension/, which the wheel
# ships as share/jupyter/labextensions/jupyter-dlc/. Idempotent: skips npm when node_modules
# matches package-lock.json, and the build when the output is newer than every input.
#   scripts/build-labextension.sh          build if needed
#   scripts/build-labextension.sh --force  always build
set -euo pipefail
cd "$(dirname "$0")/../labextension"
force=${1:-}
out=../jupyter_dlc/labextension
if ! command -v npm >/dev/null; then
  echo "build-labextension: npm not found (Node.js 18+ is needed to build the panel)" >&2
  exit 1
fi
# npm ci when node_modules is missing or older than the lock file
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --prefer-offline
fi
stamp="$out/package.json"
if [ "$force" != "--force" ] && [ -f "$stamp" ] && [ -d "$out/static" ]; then
  newer=$(find src style package.json package-lock.json tsconfig.json -newer "$stamp" -print -quit)
  if [ -z "$newer" ]; then
    echo "build-labextension: up to date ($out)"
    exit 0
  fi
fi
rm -rf lib tsconfig.tsbuildinfo "$out"
npm run build
test -f "$stamp" && ls "$out/static"/remoteEntry.*.js >/dev/null
echo "build-labextension: built $out"
