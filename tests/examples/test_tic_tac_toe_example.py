"""examples/tic_tac_toe: heuristic demonstrations and board views, and (slow) its default run end to end: SFT ->
GRPO -> eval, learning against the random bot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TTT = Path(__file__).resolve().parents[2] / "examples" / "tic_tac_toe"
sys.path.insert(0, str(TTT))

from board_context import MOVE_PARSER, LatestBoard, board_view  # noqa: E402
from demonstrations import game_turns  # noqa: E402
from train_tic_tac_toe import ratio_interval, wilson  # noqa: E402

from ludic.envs import TicTacToeEnv  # noqa: E402
from ludic.testing import alone_process_env  # noqa: E402


def test_demonstration_turns_are_the_latest_observation_and_the_heuristic_move() -> None:
    turns = game_turns(3)
    obs, reply = turns[0]
    assert obs.startswith("You are X. Board:\n1|2|3\n4|5|6\n7|8|9\n")
    assert reply == "<move>5</move>"  # the heuristic opens in the centre
    later, _ = turns[1]
    assert later.startswith("Opponent (O) played") and "X" in later.split("Board:")[1]
    assert all(r.startswith("<move>") and r.endswith("</move>") for _, r in turns)
    board_only = game_turns(3, board_only=True)
    assert [p for p, _ in board_only] == [board_view(p) for p, _ in turns]  # what LatestBoard(board_only=True) sends
    assert board_only[1][0].startswith("You are X. Board:\n")
    rnd = game_turns(3, player="random")
    assert rnd[0][1] != "<move>5</move>" or rnd[1][1] != turns[1][1]  # not the heuristic's game
    env = TicTacToeEnv(opponent="random")
    env.reset(seed=3)
    for _obs, reply in rnd:  # every random demonstration move is legal
        assert not env.step({"agent_0": reply[6:-7]})["agent_0"].info["illegal_move"]


def test_latest_board_keeps_the_board_after_a_reply_without_a_tag() -> None:
    env = TicTacToeEnv(opponent="random")
    ctx = LatestBoard()
    obs, info = env.reset(seed=1)["agent_0"]
    ctx.on_env_reset(obs, info)
    assert ctx.on_before_act() == [{"role": "user", "content": obs}]
    note = MOVE_PARSER("<mo").obs  # rejected: the env is not stepped, the note goes to the agent
    ctx.on_after_step(note, {})
    [message] = ctx.on_before_act()
    assert message["content"] == f"{note}\n{obs}" and "Board:\n1|2|3" in message["content"]
    after = env.step({"agent_0": "5"})["agent_0"]
    ctx.on_after_step(after.obs, after.info)
    assert ctx.on_before_act() == [{"role": "user", "content": after.obs}]  # the note is gone
    assert len(ctx.messages) == 3  # the full history is still recorded


def test_board_view_drops_the_notes_that_name_taken_cells() -> None:
    env = TicTacToeEnv(opponent="random")
    env.reset(seed=2)
    env.step({"agent_0": "5"})
    illegal = env.step({"agent_0": "5"})["agent_0"].obs
    assert illegal.startswith("Illegal move: cell 5 is already taken")
    view = board_view(illegal)
    assert view.startswith("You are X. Board:\n") and "5" not in view  # 5 is taken: its digit is gone
    keep, drop = LatestBoard(), LatestBoard(board_only=True)
    for ctx in (keep, drop):
        ctx.on_env_reset(illegal, {})
    assert keep.on_before_act() == [{"role": "user", "content": illegal}]
    assert drop.on_before_act() == [{"role": "user", "content": view}]


def test_intervals_match_known_values() -> None:
    assert wilson(5, 10) == pytest.approx([0.2366, 0.7634], abs=1e-4)
    assert wilson(0, 256)[0] == 0.0 and wilson(0, 256)[1] == pytest.approx(0.0148, abs=1e-4)
    # two games, 1 of 2 and 1 of 4 moves bad: ratio 2/6, game-clustered standard error
    lo, hi = ratio_interval([1, 1], [2, 4])
    r = 2 / 6
    se = (2 * ((1 - 2 * r) ** 2 + (1 - 4 * r) ** 2)) ** 0.5 / 6
    assert lo == pytest.approx(max(0.0, r - 1.96 * se)) and hi == pytest.approx(r + 1.96 * se)


def _run(out: Path, *flags: str, timeout: int) -> dict:
    cmd = [sys.executable, str(TTT / "train_tic_tac_toe.py"), "--output-dir", str(out), *flags]
    # one process, alone on the machine while the test waits: both cores' threads, as a user runs it (1.5x
    # faster here than one thread, the same summary for seed 0)
    env = alone_process_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[quickstart]" not in proc.stdout and "[tic_tac_toe]" in proc.stdout
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_default_flags_learn_against_the_random_bot(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = _run(out, timeout=1190)
    # the whole pipeline ran: SFT, GRPO (a metrics row every 5 of its 60 steps), three evaluations, the model saved
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(5, 61, 5))
    assert set(report) >= {"initial", "start_of_rl", "end"}
    assert (out / "final_model" / "config.json").is_file()
    start, end = report["start_of_rl"], report["end"]
    print(json.dumps({k: report[k] for k in ("start_of_rl", "end", "seconds")}))
    # measured (seed 0, 256 held-out games): see the README's Tic-Tac-Toe table; the 95% intervals
    # of the start and the end do not overlap, for the win rate and for the bad-move rate
    assert end["win_rate_ci95"][0] > start["win_rate_ci95"][1], report
    assert end["bad_move_rate_ci95"][1] < start["bad_move_rate_ci95"][0], report
    assert end["parse_error_rate"] <= start["parse_error_rate"] - 0.1, report
