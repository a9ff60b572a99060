#!/usr/bin/env bash
# The main job: set up .venv, then train a tiny policy with GRPO on this machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# The trainer and the embedded engine run torch on two OS threads; with OpenMP's default wait
# policy their thread teams hand the 2 cores back and forth slowly (measured: 0.21 s/step vs
# 0.13 s/step with ACTIVE on the quickstart task). Spin-waiting is right for a dedicated machine.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" TOKENIZERS_PARALLELISM=false
exec .venv/bin/ludic quickstart "$@"
