#!/usr/bin/env bash
# Set everything up, then lint and type-check, then run the whole test suite (browser tests
# included). Lint and types come first: they take seconds and fail before minutes of tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
python3 -m ruff check .          # rules: [tool.ruff] in pyproject.toml
python3 -m mypy                  # launcher, spec, client, runtime, shims: [tool.mypy]
(cd labextension && npm test --silent)
# The slowest tests are listed at the end, to keep CI time in view.
exec python3 -m pytest -q -ra --durations=25 tests "$@"
