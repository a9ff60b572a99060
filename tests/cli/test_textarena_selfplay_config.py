"""Self-play from a ``ludic train`` config: the ``multi_agent`` protocol builds one agent of the run's
harness per seat it names (examples/ecosystem/textarena_selfplay.toml), checked by ``--dry-run`` and run
for 2 steps on the tiny model with the real TextArena package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main

pytest.importorskip("textarena")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ecosystem" / "textarena_selfplay.toml"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _config(tmp_path: Path, tiny_model: Path, *swaps: tuple[str, str]) -> Path:
    text = EXAMPLE.read_text()
    for old, new in [
        ('path = "runs/tiny_model"', f'path = "{tiny_model}"'),
        (
            'output_dir = "runs/ecosystem/textarena_selfplay"',
            f'output_dir = "{tmp_path / "out"}"\nrich = false',
        ),
        *swaps,
    ]:
        assert old in text, f"the example no longer holds {old!r}"
        text = text.replace(old, new)
    path = tmp_path / "selfplay.toml"
    path.write_text(text)
    return path


def test_selfplay_config_passes_dry_run(tmp_path: Path, tiny_model: Path) -> None:
    assert main(["train", str(_config(tmp_path, tiny_model)), "--dry-run"]) == 0


def test_a_seat_the_env_does_not_have_is_named_by_dry_run(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(
        tmp_path, tiny_model, ('agents = ["player_0", "player_1"]', 'agents = ["player_0", "player_2"]')
    )
    assert main(["train", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "[protocol].kwargs.agents: ['player_2'] are not agents of env 'textarena'" in err
    assert "['player_0', 'player_1']" in err


def test_multi_agent_protocol_rejects_a_bad_seat_list() -> None:
    from ludic.registry import get_protocol

    multi = get_protocol("multi_agent")
    with pytest.raises(ValueError, match="non-empty list of env agent ids"):
        multi(new_agent=lambda: None, agents="player_0")
    with pytest.raises(ValueError, match="repeat an id"):
        multi(new_agent=lambda: None, agents=["player_0", "player_0"])


@pytest.mark.slow
def test_selfplay_config_trains_two_steps_with_one_agent_per_seat(tmp_path: Path, tiny_model: Path) -> None:
    config = _config(
        tmp_path,
        tiny_model,
        ("num_episodes = 32", "num_episodes = 4"),
        ("from_env = true\nsteps = 10", "from_env = true\nsteps = 2"),
    )
    assert main(["train", str(config), "--steps", "2"]) == 0
    out = tmp_path / "out"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/failed_rollouts"] == 0 for r in rows)
    records = [json.loads(x) for x in (out / "eval" / "eval_step_2.jsonl").read_text().splitlines()]
    # every held-out game gives one rollout per seat, each played by its own agent of the same policy
    assert sorted(r["agent_id"] for r in records) == ["player_0"] * 4 + ["player_1"] * 4


def test_plain_harness_recent_sends_only_the_latest_messages() -> None:
    from ludic.context import FullDialog, RecentMessages
    from ludic.registry import get_harness

    plain = get_harness("plain")
    assert isinstance(plain(client=object(), model="m").ctx, FullDialog)
    ctx = plain(client=object(), model="m", recent=1).ctx
    assert isinstance(ctx, RecentMessages) and ctx.keep == 1
