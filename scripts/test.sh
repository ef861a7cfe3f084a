#!/usr/bin/env bash
# Set everything up, then run the whole test suite (browser tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
(cd labextension && npm test --silent)
exec python3 -m pytest -q -ra tests "$@"
