import pytest

from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import bot_move, render, winner


def test_render_numbers_free_cells():
    assert render(list("X   O    ")) == "X|2|3\n4|O|6\n7|8|9"


def test_vs_bot_reset_gives_agent_0_an_empty_board():
    env = TicTacToeEnv()
    assert env.agent_ids == ["agent_0"] and env.active_agents == ["agent_0"]
    obs, info = env.reset(seed=0)["agent_0"]
    assert obs == "You are X. Board:\n1|2|3\n4|5|6\n7|8|9\nYour move: reply with the number of a free cell."
    assert info == {"mark": "X"}
    assert "<move>5</move>" in env.suggested_sysprompt


def test_heuristic_bot_takes_centre_then_blocks():
    env = TicTacToeEnv(opponent="heuristic")
    env.reset(seed=0)
    out = env.step({"agent_0": "1"})["agent_0"]
    assert out.obs.startswith("Opponent (O) played 5.\nYou are X. Board:\nX|2|3\n4|O|6\n7|8|9")
    assert (out.reward, out.terminated, out.info) == (0.0, False, {"illegal_move": False, "move": 1})
    assert bot_move(list("XX  O    "), "O", "heuristic", None) == 3  # block X's top row
    assert bot_move(list("XX OO X  "), "O", "heuristic", None) == 6  # winning beats blocking


def test_agent_win_gives_one_and_result_win():
    env = TicTacToeEnv()
    env.reset(seed=0)
    env.board = list("XX OO    ")
    out = env.step({"agent_0": "3"})["agent_0"]
    assert (out.reward, out.terminated, out.info["result"]) == (1.0, True, "win")
    assert out.obs.endswith("You won.")
    assert env.active_agents == []


def test_bot_win_is_a_loss_with_reward_zero():
    env = TicTacToeEnv(opponent="heuristic")
    env.reset(seed=0)
    env.board = list("OO XX    ")
    env.board[8] = "X"  # X to move, plays 7; O completes 3
    out = env.step({"agent_0": "7"})["agent_0"]
    assert winner(env.board) == "O"
    assert (out.reward, out.terminated, out.info["result"]) == (0.0, True, "loss")


def test_draw_gives_half():
    env = TicTacToeEnv()
    env.reset(seed=0)
    env.board = list("XOXXOOO X")
    out = env.step({"agent_0": "8"})["agent_0"]
    assert (out.reward, out.info["result"]) == (0.5, "draw")


def test_illegal_move_is_penalised_board_unchanged_and_explained():
    env = TicTacToeEnv()
    env.reset(seed=0)
    env.step({"agent_0": "5"})
    before = list(env.board)
    out = env.step({"agent_0": "5"})["agent_0"]
    assert (out.reward, out.terminated, out.info["illegal_move"]) == (-1.0, False, True)
    assert out.obs.startswith("Illegal move: cell 5 is already taken. Free cells: [")
    assert env.board == before
    assert env.step({"agent_0": "ten"})["agent_0"].obs.startswith(
        "Illegal move: 'ten' is not a cell number 1-9"
    )


def test_bot_opens_when_agent_does_not_start_and_is_reproducible_by_seed():
    boards = []
    for _ in range(2):
        env = TicTacToeEnv(agent_starts=False, opponent="random")
        obs, info = env.reset(seed=11)["agent_0"]
        boards.append(list(env.board))
        assert info == {"mark": "O"} and obs.startswith("Opponent (X) played ")
    assert boards[0] == boards[1] and boards[0].count("X") == 1


def test_two_player_turns_and_results_for_both_seats():
    env = TicTacToeEnv(two_player=True)
    assert env.agent_ids == ["x", "o"]
    env.reset(seed=0)
    moves = [("x", "1"), ("o", "4"), ("x", "2"), ("o", "5")]
    for aid, cell in moves:
        assert env.active_agents == [aid]
        outs = env.step({aid: cell})
        assert outs["o" if aid == "x" else "x"].obs.endswith(
            "Your move: reply with the number of a free cell."
        )
    outs = env.step({"x": "3"})
    assert outs["x"].info["result"] == "win" and outs["x"].reward == 1.0
    assert outs["o"].info["result"] == "loss" and outs["o"].reward == 0.0
    assert outs["o"].terminated and outs["o"].obs.endswith("You lost.")


def test_two_player_missing_active_seat_is_played_by_the_bot():
    env = TicTacToeEnv(two_player=True, opponent="heuristic")
    env.reset(seed=0)
    env.step({"x": "1"})
    outs = env.step({})  # "o" unmanaged: the env plays it
    assert env.board[4] == "O"
    assert outs["x"].obs.startswith("Opponent (O) played 5.")


def test_acting_out_of_turn_raises():
    env = TicTacToeEnv(two_player=True)
    env.reset(seed=0)
    with pytest.raises(KeyError, match=r"\['o'\] may not act now"):
        env.step({"o": "1"})


def test_unknown_opponent_is_rejected():
    with pytest.raises(ValueError, match="opponent must be one of"):
        TicTacToeEnv(opponent="minimax")
