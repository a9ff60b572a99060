#!/usr/bin/env bash
# The main job: set up .venv, then train a tiny policy with GRPO on this machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# OpenMP's default wait policy makes the 2-thread team sleep and wake between the tiny model's small ops
# (measured: 0.21 s/step vs 0.13 s/step with ACTIVE on the quickstart task). Spin-waiting is right for a
# dedicated machine; on a busy one Ludic drops to fewer intra-op threads by itself (the cores other
# processes take, ludic/kernels/cpu/threads.py), so no thread spins waiting for one that has no core.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" TOKENIZERS_PARALLELISM=false
exec .venv/bin/ludic quickstart "$@"
