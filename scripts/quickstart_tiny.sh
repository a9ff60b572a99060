#!/usr/bin/env bash
# The tiny quickstart: build a ~0.8M-parameter model, SFT warm start, GRPO on the letter task (~25 s).
# The fast path for tests and CI; the main job on a real model is scripts/quickstart.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# Spin-waiting OpenMP threads suit a dedicated machine; Ludic lowers its thread count when other
# processes take cores (ludic.kernels.cpu.threads), so a busy machine does not stall them.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" TOKENIZERS_PARALLELISM=false
exec .venv/bin/ludic quickstart "$@"
