"""``ludic train examples/ecosystem/reasoning_gym.toml`` as shipped (the tiny model built for it, one
seed): held-out reward after SFT + RL beats the best constant answer on the same held-out items."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.testing import alone_process_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ecosystem" / "reasoning_gym.toml"


def _best_constant(config: Path) -> tuple[str, float]:
    spec = importlib.util.spec_from_file_location(
        "best_constant", ROOT / "examples/ecosystem/best_constant.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.best_constant(str(config))


@pytest.mark.timeout(900)  # about 2.5 min on a 2-core machine
def test_reasoning_gym_example_beats_the_best_constant_answer(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    from ludic.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)  # what the example's header builds
    text = EXAMPLE.read_text()
    for old, new in [
        ('path = "runs/tiny_model"', f'path = "{model}"'),
        ('output_dir = "runs/ecosystem/reasoning_gym"', f'output_dir = "{tmp_path / "out"}"\nrich = false'),
    ]:
        assert old in text, f"the example no longer holds {old!r}"
        text = text.replace(old, new)
    config = tmp_path / "reasoning_gym.toml"
    config.write_text(text)
    # `ludic train` in its own process, the only thing computing while the test waits: both cores' threads, as
    # a user runs it (pytest's own process is held at the suite's one thread)
    done = subprocess.run([sys.executable, "-m", "ludic.cli", "train", str(config)], capture_output=True, text=True,
                          timeout=880, env=alone_process_env())  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reward = {
        step: json.loads((tmp_path / "out" / "eval" / f"eval_step_{step}_summary.json").read_text())[
            "eval/avg_total_reward"
        ]
        for step in ("-1", "0", str(_steps(text)))
    }
    constant, bar = _best_constant(config)
    print(f"held-out reward: before SFT {reward['-1']:.3f}, after SFT {reward['0']:.3f}, "
          f"after RL {reward[str(_steps(text))]:.3f}; best constant {constant!r} {bar:.3f}")  # fmt: skip
    assert reward[str(_steps(text))] > bar


def _steps(text: str) -> int:
    import tomllib

    return int(tomllib.loads(text)["steps"])
