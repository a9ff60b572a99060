"""A TextArena game from a ``ludic train`` / ``ludic eval`` config: ``--dry-run`` passes single-player games
without an opponent and two-seat games whose board lists moves, and refuses the others with the game's
reason (no listed moves for the 'random' opponent, a game that does not import here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ludic.cli import main

pytest.importorskip("textarena")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ecosystem" / "textarena_tictactoe.toml"
KWARGS = 'kwargs = { game = "TicTacToe-v0", players = [0], opponent = "random", observation = "board_only" }'


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _config(tmp_path: Path, tiny_model: Path, env_kwargs: str, sft: bool = False) -> Path:
    text = EXAMPLE.read_text()
    if not sft:
        text, dropped = re.subn(r"\[sft\][^\n]*\nfrom_env = true\nsteps = 50\n", "", text)
        assert dropped == 1, "the example's [sft] table changed"
    for old, new in [
        ('path = "runs/tiny_model"', f'path = "{tiny_model}"'),
        ('output_dir = "runs/ecosystem/textarena_tictactoe"', f'output_dir = "{tmp_path / "out"}"'),
        (KWARGS, f"kwargs = {env_kwargs}"),
    ]:
        assert old in text, f"the example no longer holds {old!r}"
        text = text.replace(old, new)
    path = tmp_path / "game.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "env_kwargs",
    [
        '{ game = "FrozenLake-v0", observation = "board_only" }',  # single player: 1 seat, no opponent
        '{ game = "TowerOfHanoi-v0" }',  # single player, no listed moves: nothing for a bot to do
        '{ game = "KuhnPoker-v0", observation = "full" }',  # bot reads "available actions are"
    ],
)
@pytest.mark.parametrize("command", ["train", "eval"])
def test_games_that_play_pass_the_dry_run(
    tmp_path: Path, tiny_model: Path, env_kwargs: str, command: str
) -> None:
    assert main([command, str(_config(tmp_path, tiny_model, env_kwargs)), "--dry-run"]) == 0


@pytest.mark.parametrize(
    ("env_kwargs", "reason"),
    [
        ('{ game = "Nim-v0" }', "Nim-v0 lists no moves"),  # was: the first episode fails at the bot's turn
        ('{ game = "ReverseTicTacToe-v0" }', "SyntaxError"),  # was: a crash inside TextArena at reset
    ],
)
@pytest.mark.parametrize("command", ["train", "eval"])
def test_games_that_cannot_play_are_refused_by_the_dry_run_with_the_reason(
    tmp_path: Path,
    tiny_model: Path,
    env_kwargs: str,
    reason: str,
    command: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([command, str(_config(tmp_path, tiny_model, env_kwargs)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "[env]" in err and reason in err


def test_self_play_of_a_game_without_listed_moves_passes(tmp_path: Path, tiny_model: Path) -> None:
    config = _config(tmp_path, tiny_model, '{ game = "Nim-v0", players = [0, 1] }')
    text = config.read_text().replace(
        'name = "single_agent"', 'name = "multi_agent"\nkwargs = { agents = ["player_0", "player_1"] }'
    )
    config.write_text(text)
    assert main(["train", str(config), "--dry-run"]) == 0


def test_sft_from_a_game_without_listed_moves_is_refused_by_the_dry_run(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            ["train", str(_config(tmp_path, tiny_model, '{ game = "FrozenLake-v0" }', sft=True)), "--dry-run"]
        )
        == 0
    )
    config = _config(tmp_path, tiny_model, '{ game = "TowerOfHanoi-v0" }', sft=True)
    assert main(["train", str(config), "--dry-run"]) == 2
    assert "TowerOfHanoi-v0 lists no moves in seat 0's 'first_last' observation" in capsys.readouterr().err
