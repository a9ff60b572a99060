#!/usr/bin/env bash
# Prepare what the GPU machine lacks, in the git-ignored .gpu_carry/ (64 MiB at most travels in all):
# cp312 / pure-Python wheels of what Ludic and the checks import there (its python3 is 3.12 with torch,
# transformers, peft, safetensors, tokenizers, jaxtyping, msgpack, httpx, rich, numpy; no pydantic, no
# beartype, maybe no pytest). scripts/gpu_check.sh unpacks only those its python cannot import.
# Then carry it:  run(command="bash scripts/gpu_check.sh \$OUT/gpu", carry=[".gpu_carry"])
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.gpu_carry"
WHEELS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions beartype
        pytest pluggy iniconfig pytest-asyncio pytest-timeout pyyaml jinja2 markupsafe
        matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six)  # the quickstart's plot
rm -rf "$DEST" && mkdir -p "$DEST/wheels"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
"$PIP" download --quiet --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --no-deps -d "$DEST/wheels" "${WHEELS[@]}"
git -C "$ROOT" rev-parse --short HEAD > "$DEST/COMMIT"
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]; then sed -i 's/$/+dirty/' "$DEST/COMMIT"; fi
SIZE=$(du -sb "$DEST" | cut -f1)
echo "gpu_carry: $(ls "$DEST/wheels" | wc -l) wheels, $((SIZE / 1024)) KiB in $DEST (commit $(cat "$DEST/COMMIT"))"
if [ "$SIZE" -gt $((48 * 1024 * 1024)) ]; then echo "gpu_carry: over 48 MiB, leaves too little of the 64 MiB" >&2; exit 1; fi
