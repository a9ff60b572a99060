"""examples/tic_tac_toe: heuristic demonstrations, and SFT -> GRPO -> eval end to end on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TTT = Path(__file__).resolve().parents[2] / "examples" / "tic_tac_toe"
sys.path.insert(0, str(TTT))

from demonstrations import game_turns  # noqa: E402


def test_demonstration_turns_replay_the_dialog_the_agent_sees() -> None:
    turns = game_turns(3)
    messages, reply = turns[0]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].startswith("You are X. Board:\n1|2|3\n4|5|6\n7|8|9\n")
    assert reply == "<move>5</move>"  # the heuristic opens in the centre
    later, _ = turns[1]
    assert [m["role"] for m in later] == ["system", "user", "assistant", "user"]
    assert later[2]["content"] == "<move>5</move>"
    assert all(r.startswith("<move>") and r.endswith("</move>") for _, r in turns)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_train_script_runs_sft_grpo_and_eval(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, str(TTT / "train_tic_tac_toe.py"), "--output-dir", str(out), "--steps", "2",
           "--sft-steps", "2", "--sft-games", "4", "--group-size", "2", "--prompts-per-step", "2",
           "--eval-episodes", "2", "--max-new-tokens", "8"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "sft_model" / "config.json").is_file()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    final = json.loads((out / "eval" / "eval_step_2_summary.json").read_text())
    assert 0.0 <= final["eval/win_rate"] <= 1.0
    assert final["eval/num_episodes"] == 2.0
