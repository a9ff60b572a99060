#!/usr/bin/env bash
# The GPU machine's one command: bash scripts/gpu_check.sh OUT_DIR [--dry-run] [--only SECTION ...]
# Runs Ludic from source (PYTHONPATH=src) with the machine's python3; wheels from .gpu_carry/ (made by
# scripts/gpu_carry.sh) are unpacked only for the modules that python cannot import. Writes
# OUT_DIR/report.md and OUT_DIR/report.json within 8 minutes on one H100 (bench/gpu_check.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: gpu_check.sh OUT_DIR [--dry-run] [--only SECTION ...]}"
shift
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
SITE="$OUT/.carried_site"
CARRIED=$("$PY" - "$ROOT/.gpu_carry/wheels" "$SITE" <<'PYEOF'
import importlib.util, sys, zipfile
from pathlib import Path
wheels, site = Path(sys.argv[1]), Path(sys.argv[2])
# wheel name prefix -> the module that shows whether the machine has it
MODULES = {"pydantic-": "pydantic", "pydantic_core": "pydantic_core", "annotated_types": "annotated_types",
           "typing_inspection": "typing_inspection", "typing_extensions": "typing_extensions", "beartype": "beartype",
           "pytest-": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig", "pytest_asyncio": "pytest_asyncio",
           "pytest_timeout": "pytest_timeout", "pyyaml": "yaml", "PyYAML": "yaml", "jinja2": "jinja2",
           "markupsafe": "markupsafe", "MarkupSafe": "markupsafe", "matplotlib": "matplotlib", "contourpy": "contourpy",
           "cycler": "cycler", "fonttools": "fontTools", "kiwisolver": "kiwisolver", "pillow": "PIL",
           "pyparsing": "pyparsing", "python_dateutil": "dateutil", "six-": "six"}
used = []
for wheel in sorted(wheels.glob("*.whl")) if wheels.is_dir() else []:
    module = next((m for prefix, m in MODULES.items() if wheel.name.lower().startswith(prefix.lower())), None)
    if module is None or importlib.util.find_spec(module) is not None:
        continue
    zipfile.ZipFile(wheel).extractall(site)
    used.append(wheel.name.split("-")[0] + "==" + wheel.name.split("-")[1])
print(",".join(used))
PYEOF
)
export LUDIC_GPU_CARRIED="$CARRIED"
export PYTHONPATH="$ROOT/src:$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
echo "gpu_check: carried and unpacked: ${CARRIED:-nothing}"
exec "$PY" "$ROOT/bench/gpu_check.py" "$OUT" "$@"
