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
# With arguments: pytest with them, as given.
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# Without: the default suite; in CI (CI=true) the slow tests too, which the 90-minute budget allows only
# because of the two phases below.
SELECT="not slow and not gpu"
if [ "${CI:-}" = "true" ]; then
    SELECT="not gpu"
fi
# Phase 1: the tests that may share the machine, on two workers (one intra-op thread each), a file per worker
# at a time (module fixtures such as a served model are built once). Phase 2: the tests marked `alone` (tests/
# conftest.py's RUN_ALONE: several processes, both cores, or a wall-clock bound), one after another.
status=0
.venv/bin/python -m pytest -m "($SELECT) and not alone" -n 2 --dist loadfile || status=$?
.venv/bin/python -m pytest -m "($SELECT) and alone" || status=$?
exit "$status"
