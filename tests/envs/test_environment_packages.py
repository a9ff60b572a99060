"""The runnable packages under environments/ play real episodes through SingleAgentProtocol."""

import importlib
from pathlib import Path

import pytest

ENVIRONMENTS = Path(__file__).resolve().parents[2] / "environments"


@pytest.fixture
def load(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVIRONMENTS))
    return importlib.import_module


def test_board_from_obs_reads_back_the_env_observation(load):
    ttt = load("tic_tac_toe")
    env = ttt.make_env()
    env.reset(seed=0)
    obs = env.step({"agent_0": "1"})["agent_0"].obs
    board, mark = ttt.board_from_obs(obs)
    assert (board, mark) == (list("X   O    "), "X")


def test_tic_tac_toe_heuristic_player_beats_the_random_opponent(load, capsys):
    results = load("tic_tac_toe.play").main(["--episodes", "3", "--opponent", "random"])
    assert dict(results) == {"win": 3}
    assert "episode 0: win" in capsys.readouterr().out


def test_heuristic_against_heuristic_never_loses(load):
    results = load("tic_tac_toe.play").main(["--episodes", "3", "--opponent", "heuristic"])
    assert results["loss"] == 0 and sum(results.values()) == 3


def test_gsm8k_qa_oracle_answers_every_local_problem(load, capsys):
    gsm = load("gsm8k_qa")
    assert len(gsm.load_problems()) == 8
    assert gsm.make_env(5).target_answer == "1,250"
    assert load("gsm8k_qa.play").main([]) == 1.0
    assert "accuracy: 8/8" in capsys.readouterr().out
