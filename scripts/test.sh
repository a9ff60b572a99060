#!/usr/bin/env bash
# Run the whole default test suite (sets up .venv first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
.venv/bin/python -m ruff check src tests bench examples environments
.venv/bin/python -m pytest "$@"
