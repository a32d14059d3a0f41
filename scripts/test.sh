#!/usr/bin/env bash
# Lint, format check and the test suite, in ./.venv (made by scripts/setup.sh --dev).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# One worker per core (two on CI); a test file stays on one worker, so its module fixtures
# (a trained tiny run) are built once; the slowest files go first (tests/conftest.py).
# HANLM_TEST_WORKERS=0 runs in this process.
.venv/bin/python -m pytest -q -n "${HANLM_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder "$@"
