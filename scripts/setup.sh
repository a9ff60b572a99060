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
