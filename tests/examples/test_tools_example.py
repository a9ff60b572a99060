"""examples/tools/: a calculator-using agent against the same model without the tool.

Fast: the task's reward and the demonstrations (their ids are what the agent's calls send, on the tiny
tokenizer and on SmolLM2's BPE one, and the call they teach continues the opening Ludic's server prefills for
``tool_choice``). Slow: a short SmolLM2 run of ``train_tools.py`` (both agents through Ludic's server, a real
subprocess) runs every phase of both agents, reports them, and the tool agent ends above the agent without
the tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.inference.server._tool_calls import ToolMode, prefill_text
from ludic.inference.tool_parsers import HermesToolParser
from ludic.testing import CHATML_TEMPLATE, alone_process_env, build_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tools"
sys.path.insert(0, str(EXAMPLE))

from calculator import FORCE_ADD, SumEnv, call_text, demonstrations, operands  # noqa: E402


def test_the_env_pays_the_exact_sum_only() -> None:
    env = SumEnv(digits=3)
    obs, _ = env.env_reset(seed=7)
    a, b = operands(7, 3)
    assert obs == f"What is {a} + {b}?" and 100 <= a <= 999 and 100 <= b <= 999
    assert env.env_step(f" {a + b}\n").reward == 1.0
    env.env_reset(seed=7)
    assert env.env_step(str(a + b + 1)).reward == 0.0


def test_demonstrations_teach_the_continuation_of_the_forced_call_on_the_agents_prompts(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    tool_items = demonstrations(tokenizer, range(3), digits=3, tool=True)
    plain_items = demonstrations(tokenizer, range(3), digits=3, tool=False)
    assert len(tool_items) == 6 and len(plain_items) == 3
    a, b = operands(0, 3)
    call, answer = tool_items[0], tool_items[1]
    forced = prefill_text(HermesToolParser(), ToolMode(True, True, forced=FORCE_ADD["function"]["name"],
                                                       allowed=frozenset({"add"})), CHATML_TEMPLATE)  # fmt: skip
    assert call_text(a, b).startswith(forced)
    n = call.meta["prompt_length"]
    prompt, reply = tokenizer.decode(call.input_ids[:n]), tokenizer.decode(call.input_ids[n:])
    assert '"name": "add"' in prompt  # the tools block, as the agent's tools=[ADD] renders it
    # the server prefills the forced opening: prompt, as in RL; the model learns the rest of the call
    assert prompt.endswith(f"What is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n{forced}")
    assert reply == call_text(a, b)[len(forced) :] + "<|im_end|>"
    assert call.action_mask == [0] * n + [1] * (len(call.input_ids) - n)
    m = answer.meta["prompt_length"]
    assert answer.input_ids[: len(call.input_ids)] == call.input_ids  # the call's ids verbatim, as the splice keeps them
    assert tokenizer.decode(answer.input_ids[len(call.input_ids) : m]) == (
        f"\n<|im_start|>tool\n{a + b}<|im_end|>\n<|im_start|>assistant\n"
    )  # then the tool's result
    assert tokenizer.decode(answer.input_ids[m:]) == f"{a + b}<|im_end|>"
    plain = plain_items[0]
    assert "add" not in tokenizer.decode(plain.input_ids)  # the baseline's prompt has no tools block


def test_on_smollm2s_bpe_tokenizer_the_demonstrated_call_is_the_calls_own_tokenisation() -> None:
    """SmolLM2's tokenizer writes `` {"`` as one token: the server's forced opening (prompt) and the trained rest
    must split the call where the tokenizer does, or SFT teaches ids the model never samples after the opening."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_tokenizer")
    call, answer = demonstrations(tokenizer, range(1), digits=3, tool=True)
    a, b = operands(0, 3)
    whole = tokenizer.encode(call_text(a, b), add_special_tokens=False)
    forced = prefill_text(HermesToolParser(), ToolMode(True, True, forced="add", allowed=frozenset({"add"})),
                          tokenizer.chat_template)  # fmt: skip
    ids, n, eot = call.input_ids, call.meta["prompt_length"], tokenizer.eos_token_id
    assert ids[-len(whole) - 1 :] == [*whole, eot]  # the call as the tokenizer spells it, then the end of the turn
    opening = tokenizer.encode(forced, add_special_tokens=False)
    assert ids[n - len(opening) : n] == opening == whole[: len(opening)]  # the server's prefill: prompt
    assert answer.input_ids[: len(ids)] == ids


@pytest.mark.slow
def test_on_smollm2_the_tool_agent_ends_above_the_agent_without_it(tmp_path: Path) -> None:
    """A short form of the documented SmolLM2 run. The tool agent scores only when its call's arguments parse as a
    ``tool_calls`` entry (else it answers ""), ``add`` runs, and the model copies the result; the model cannot add
    three-digit numbers in its head, so the agent without the tool stays below."""
    pytest.importorskip("openai")
    from ludic.models.cache import is_prepared
    from ludic.models.pull import prepared_path

    model = prepared_path("smollm2-135m-instruct")
    if not is_prepared(model):
        pytest.fail(f"{model} is missing: bash scripts/setup.sh pulls it (ludic models pull smollm2-135m-instruct)")
    # the server generates while this process waits, and this process trains while the server waits: each
    # has the machine to itself in turn, so both take both cores' threads, as a user's run does
    env = alone_process_env()
    args = ["--model", str(model), "--output-dir", str(tmp_path), "--eval-episodes", "8", "--sft-steps", "5",
            "--sft-batch", "8", "--sft-lr", "1e-4", "--lr", "2e-5", "--steps", "1", "--prompts", "2",
            "--group-size", "2"]  # fmt: skip
    proc = subprocess.run([sys.executable, str(EXAMPLE / "train_tools.py"), *args], env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "summary.json").read_text())
    for agent in ("tool", "no_tool"):  # both agents ran every phase through Ludic's server
        assert set(report[agent]) >= {"initial", "after_sft", "end"}, report
        [row] = [json.loads(line) for line in (tmp_path / f"{agent}_metrics.jsonl").read_text().splitlines()]
        assert row["step"] == 1 and "train/avg_total_reward" in row
        assert f"[{agent}] held-out reward: initial" in proc.stdout
    assert "held-out reward with the calculator" in proc.stdout
    assert report["tool"]["after_sft"] >= 0.75 and report["tool"]["end"] >= 0.75, report
    assert report["tool"]["end"] >= report["no_tool"]["end"] + 0.5, report
