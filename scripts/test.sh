#!/usr/bin/env bash
# Lint, format check and the test suite, in ./.venv (made by scripts/setup.sh --dev).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q "$@"
