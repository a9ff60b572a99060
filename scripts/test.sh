#!/usr/bin/env bash
# Run the whole default test suite (sets up .venv first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# One intra-op thread: the tiny models gain little from two, and two spin-waiting threads on a
# busy 2-core machine can slow a test by 30x.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
# Every extra the tests import is installed above: a test that would skip for a missing one fails instead.
export LUDIC_REQUIRE_EXTRAS=1
.venv/bin/python -m ruff check src tests bench examples environments
# In CI (CI=true, no arguments) the slow tests run too: the 90-minute budget allows them.
if [ "${CI:-}" = "true" ] && [ $# -eq 0 ]; then
    set -- -m "not gpu"
fi
.venv/bin/python -m pytest "$@"
