#!/usr/bin/env bash
# Set everything up, then lint and type-check, then run the whole test suite (browser tests
# included). Lint and types come first: they take seconds and fail before minutes of tests.
#
#   bash scripts/test.sh --fast [pytest args]   the fast tier, under 3 minutes: lint, types,
#       jest and the tests in tests/conftest.py's FAST_MODULES (no cluster, browser, kernel
#       or many ranks); it skips the set-up, so run the full command (or scripts/setup.sh)
#       once first.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ "${1:-}" == "--fast" ]]; then
    fast=1
    shift
fi
if (( ! fast )); then
    bash scripts/setup.sh
fi
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
python3 -m ruff check .          # rules: [tool.ruff] in pyproject.toml
python3 -m mypy                  # launcher, spec, client, runtime, shims: [tool.mypy]
lint-imports                     # ARCHITECTURE.md's import table: [tool.importlinter]
(cd labextension && npm test --silent)
if (( fast )); then
    exec python3 -m pytest -q -ra -m fast --durations=5 tests "$@"
fi
# The slowest tests are listed at the end, to keep CI time in view.
exec python3 -m pytest -q -ra --durations=25 tests "$@"
