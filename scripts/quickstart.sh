#!/usr/bin/env bash
# The main job: set up .venv, then train a tiny policy with GRPO on this machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
exec .venv/bin/ludic quickstart "$@"
