"""Train an OpenAI-SDK agent program (a draft, then a revision that sees it) with GRPO on Ludic's server.

    python examples/ecosystem/openai_program_train.py                # ~3 min on 2 CPU cores
    python examples/ecosystem/openai_program_train.py --seed 1 --output-dir runs/openai_program_s1

The program (``draft_then_revise`` in ``openai_program.py``) is plain ``openai`` code talking to
``python -m ludic.inference.server`` (a subprocess on 127.0.0.1); the task is the quickstart's
(``letter_repeat``: "Repeat c 4 times.", letters a-h, reward = characters right). Phases, top to bottom:
held-out reward of the untrained model -> SFT warm start in this process on the quickstart's
demonstrations (single-turn answers: the draft learns the task, the revision, which sees a second user
turn, stays near chance), published to the server -> held-out reward (start of RL) -> GRPO (``RolloutEngine`` +
``RolloutBatchSource`` + ``Trainer``, the weights uploaded to the server after every step) -> held-out
reward (end). Held-out: 64 fixed env seeds, temperature 1 with fixed sampling seeds. One line per step on
screen; every stat in ``<output-dir>/metrics.jsonl``; the figures in ``<output-dir>/summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openai_program import draft_then_revise

from ludic.distributed import ClientPublisher
from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.eval import Evaluator
from ludic.inference import SamplingConfig, VLLMChatClient
from ludic.interaction import OpenAIProgramProtocol
from ludic.quickstart.demonstrations import demonstration_items
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server
from ludic.training import (
    RolloutEngine,
    SeededRequests,
    TrainerConfig,
    make_grpo,
    online_trainer,
    seeded_episode,
    sft_trainer,
)
from ludic.training.loggers import before_after, progress_and_metrics

LETTERS = "abcdefgh"  # the quickstart's letters: chance reward is about 1/8
EVAL_SEED, SFT_SEED, TRAIN_SEEDS_PER_RUN = 1_000_000, 500_000, 100_000  # disjoint env seed ranges
SAMPLING = SamplingConfig(temperature=1.0, max_tokens=8)  # what the program leaves out
# One letter_repeat prompt played by the program (RolloutBatchSource makes it a GRPO group).
episode = seeded_episode("letter_repeat", "program", env_kwargs={"letters": LETTERS}, sampling=SAMPLING)


async def sft_warm_start(model, tokenizer, *, steps: int, seed: int) -> None:
    """The quickstart's demonstrations (single-turn answers), trained in this process (no publish yet)."""
    items = demonstration_items(tokenizer, seeds=range(SFT_SEED, SFT_SEED + 16 * steps), letters=LETTERS)
    cfg = TrainerConfig(lr=1e-3, max_seq_len=256, micro_token_budget=8192)
    await sft_trainer(model, items, batch_size=16, seed=seed, cfg=cfg).train(steps)


async def train(args: argparse.Namespace, model, tokenizer, url: str) -> dict[str, float]:
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)  # the one-blob upload to Ludic's server
    publisher = ClientPublisher(client)
    engine = RolloutEngine(
        env_registry={"letter_repeat": LetterRepeatEnv},
        protocol_registry={"program": lambda: OpenAIProgramProtocol(draft_then_revise, base_url=url + "/v1")},
        one_sequence=True,  # both calls of an episode train as one exact sequence
    )
    evaluator = Evaluator(engine=engine, requests=[episode(EVAL_SEED + i) for i in range(args.eval_episodes)],
                          max_steps=2, concurrency=args.eval_episodes)  # fmt: skip

    async def held_out() -> float:
        return (await evaluator.evaluate())["eval/avg_total_reward"]

    report = {"initial": await held_out()}
    await sft_warm_start(model, tokenizer, steps=args.sft_steps, seed=args.seed)
    # The RL trainer publishes version = its step (1, 2, ...); versions never go backwards, so the warm
    # start goes up at the version the server serves now (a fresh server: 0, accepted again).
    served = await client.get_policy_version()
    if served != 0:
        raise RuntimeError(f"the server serves policy_version {served}; this script needs a fresh server (0)")
    publisher.publish(model.state_dict(), version=served)
    report["start_of_rl"] = await held_out()

    first = args.seed * TRAIN_SEEDS_PER_RUN  # each run's seed range of its own
    requests = SeededRequests(episode, per_step=args.prompts, next_seed=first, stop=first + TRAIN_SEEDS_PER_RUN)
    cfg = TrainerConfig(lr=args.lr, lr_schedule="linear", warmup_steps=min(5, args.steps),
                        total_steps=args.steps, max_seq_len=512, micro_token_budget=8192)  # fmt: skip
    logger = progress_and_metrics(args.output_dir / "metrics.jsonl", "[openai_program]", total_steps=args.steps)
    trainer = online_trainer(model, engine=engine, algo=make_grpo(group_size=args.group_size), request_fn=requests,
                             max_steps=2, publisher=publisher, cfg=cfg, train_logger=logger)  # fmt: skip
    rl_start = time.perf_counter()
    await trainer.train(args.steps)
    report["rl_seconds"] = time.perf_counter() - rl_start
    report["end"] = await held_out()
    report["served_version"] = await client.get_policy_version()  # the trainer's last step: every publish landed
    await client.aclose()
    return report


def main(args: argparse.Namespace) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model_dir = build_tiny_model(args.output_dir / "initial_model", seed=args.seed)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    with running_server(model_dir) as url:  # python -m ludic.inference.server MODEL_DIR on 127.0.0.1
        report = asyncio.run(train(args, model, tokenizer, url))
    report["total_seconds"] = time.perf_counter() - started
    (args.output_dir / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    print(before_after("held-out reward, initial -> start of RL:", report["initial"], report["start_of_rl"],
                       prefix="[openai_program]"))  # fmt: skip
    print(before_after("held-out reward, start of RL -> end:", report["start_of_rl"], report["end"],
                       prefix="[openai_program]"))  # fmt: skip
    print(f"[openai_program] {report['total_seconds']:.0f} s in all; stats: {args.output_dir / 'metrics.jsonl'}")
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="model init, SFT order and training env seeds")
    p.add_argument("--steps", type=int, default=40, help="GRPO steps")
    p.add_argument("--sft-steps", type=int, default=60, help="SFT warm-start steps of 16 demonstrations")
    p.add_argument("--group-size", type=int, default=8, help="episodes per prompt (GRPO group)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--lr", type=float, default=5e-4, help="RL learning rate (1e-3 collapsed seed 1)")
    p.add_argument("--eval-episodes", type=int, default=64, help="held-out episodes (fixed seeds)")
    p.add_argument("--output-dir", type=Path, default=Path("runs/openai_program"))
    return p.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
