"""SFT warm starts and the evaluations around them: ``[sft]`` in ``ludic train`` and ``ludic quickstart``.

:func:`sft_in_place` is the one SFT pass both use: it trains the run's policy in place (the model
``build_train_run`` loaded) with the run's trainer settings at the SFT learning rate and a constant
schedule, and publishes to the run's engine at the version it served before the SFT, so that RL versions
count RL steps from there on any backend (the embedded engine or a server, where versions cannot go back). :func:`start_of_run` is ``ludic train``'s opening: a held-out evaluation
before SFT (step -1), the SFT, and one at the start of RL (step 0); a resumed run reads both back
instead of redoing them (the checkpoint's weights already hold the SFT).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.config import RunConfig
from ludic.training.loggers.eval_summary import read_eval_summary, summary_path
from ludic.training.loggers.prefix import as_number
from ludic.training.types import SAWItem

BEFORE_SFT_STEP = -1
"""The evaluation step of the held-out evaluation before the SFT warm start (``eval_step_-1_*``)."""
REWARD = "eval/avg_total_reward"
ACCURACY = "eval/accuracy"


async def sft_in_place(
    run: Any,
    items: list[SAWItem],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    shuffle: bool = False,
    seed: int = 0,
) -> None:
    """SFT ``run.trainer.model`` on ``items`` for ``steps`` batches; ``run`` is a ``TrainRun``."""
    from ludic.distributed import ClientPublisher
    from ludic.distributed.lora_payload import lora_publish_mode
    from ludic.training.batching import OfflineBatchSource
    from ludic.training.loggers import ProgressLogger
    from ludic.training.presets import make_sft
    from ludic.training.trainer import Trainer

    source = OfflineBatchSource(items, batch_size=batch_size, shuffle=shuffle, seed=seed)
    # the run's own publisher (a vLLM backend's weight-transfer group is joined once per run); [lora]: the adapter
    publisher = getattr(run, "publisher", None) or ClientPublisher(
        run.client, lora=lora_publish_mode(run.trainer.publisher)
    )
    sft_cfg = dataclasses.replace(  # the run's trainer settings at the SFT learning rate, no schedule
        run.cfg.trainer, lr=lr, learning_rate=None, eval_every_n_steps=None,
        lr_schedule="constant", warmup_steps=0, total_steps=None, step_in_thread=False,
    )  # fmt: skip
    trainer = Trainer(
        model=run.trainer.model,
        algo=make_sft(),
        batch_source=source,
        publisher=HeldVersionPublisher(publisher, await run.client.get_policy_version()),
        cfg=sft_cfg,
        train_logger=ProgressLogger(  # SFT progress on stdout, a line per ~5% (minutes pass otherwise in silence)
            "SFT", total_steps=steps, keys={"loss": "train/loss"}, every=max(1, math.ceil(steps / 20)), clock=True
        ),
    )
    await trainer.train(steps)


class HeldVersionPublisher:
    """Publishes every update at one ``version``: the SFT trainer would publish ``version=step``, leaving
    the engine ahead of RL step 0 (the first RL items would look newer than the trainer, and a server
    refuses the RL trainer's lower versions: they must not go backwards)."""

    def __init__(self, inner: Any, version: int) -> None:
        self.inner, self.version = inner, version

    def publish(self, state_dict: Any, version: int | None = None) -> None:
        self.inner.publish(state_dict, version=self.version)

    @property
    def last_stats(self) -> dict[str, float]:
        return dict(getattr(self.inner, "last_stats", {}) or {})


def reset_policy_version(client: Any) -> None:
    """Restart an in-process engine's policy versions at 0 (``restart_versions``; not reachable over HTTP)."""
    client.restart_versions(0)


async def warm_start_from_config(run: Any) -> None:
    """``[sft]``: its demonstrations as SFT items, then :func:`sft_in_place` (shuffled by ``[sft].seed``)."""
    from ludic.cli.demonstrations import demonstration_items
    from ludic.cli.runtime import load_tokenizer

    cfg: RunConfig = run.cfg
    sft = cfg.sft
    assert sft is not None
    tokenizer = getattr(run.client, "tokenizer", None) or load_tokenizer(cfg)
    seed = cfg.seed if sft.seed is None else sft.seed
    items = demonstration_items(cfg, tokenizer)
    print(f"ludic train: SFT warm start, {sft.steps} steps of {sft.batch_size} from {len(items)} demonstrations "
          f"at lr {sft.lr}", flush=True)  # fmt: skip
    await sft_in_place(
        run, items, steps=sft.steps, batch_size=sft.batch_size, lr=sft.lr, shuffle=True, seed=seed
    )


@dataclass
class StartEvals:
    """Held-out statistics before the SFT warm start (None without ``[sft]``) and at the start of RL."""

    before_sft: dict[str, float] | None
    start_of_rl: dict[str, float] | None


async def start_of_run(run: Any) -> StartEvals:
    """Evaluate, warm-start (``[sft]``), evaluate; a resumed run (step > 0) reads the summaries back."""
    sft = run.cfg.sft is not None
    if run.trainer.step > 0:
        return StartEvals(_summary(run, BEFORE_SFT_STEP) if sft else None, _summary(run, 0))
    before_sft = None
    if sft:
        before_sft = await run.evaluator.evaluate(step=BEFORE_SFT_STEP)
        await warm_start_from_config(run)
    return StartEvals(before_sft, await run.evaluator.evaluate(step=0))


def _summary(run: Any, step: int) -> dict[str, float] | None:
    """A resumed run's summary of evaluation ``step``; None (reported as not measured) when there is none or it
    cannot be read: the reporting of a past evaluation must not stop the run."""
    path = summary_path(run.out_dir / "eval", step)
    return read_eval_summary(path, "its result is reported as not measured") if path.is_file() else None


def report_start_and_end(start: StartEvals, after: dict[str, float], eval_dir: Path) -> None:
    """One line: held-out reward before SFT (with ``[sft]``), at the start of RL, after RL."""

    def fmt(stats: dict[str, float] | None, key: str = REWARD) -> str:
        value = as_number(stats.get(key)) if stats else None  # a summary's null or string: not a number
        return "not measured" if value is None else f"{value:.3f}"

    if start.before_sft is None:
        phases = f"before training {fmt(start.start_of_rl)}"
    else:
        phases = f"before SFT {fmt(start.before_sft)}, after SFT (start of RL) {fmt(start.start_of_rl)}"
    print(f"ludic train: held-out {REWARD} {phases}, after {after.get(REWARD, float('nan')):.3f} "
          f"({eval_dir}/eval_step_*_summary.json)", flush=True)  # fmt: skip
    if ACCURACY in after and start.start_of_rl and ACCURACY in start.start_of_rl:
        before = fmt(start.before_sft or start.start_of_rl, ACCURACY)
        print(f"ludic train: held-out {ACCURACY} before training {before}, after {fmt(after, ACCURACY)}",
              flush=True)  # fmt: skip


def sft_to_dir(
    cfg: RunConfig, items: list[Any], *, steps: int, batch_size: int, lr: float, out_dir: Path
) -> Path:
    """SFT ``cfg.model.path`` on SAW ``items`` (``make_sft``) apart from any run, save to ``out_dir``."""
    import torch

    from ludic.cli.runtime import load_policy, load_tokenizer
    from ludic.training.batching import OfflineBatchSource
    from ludic.training.presets import make_sft
    from ludic.training.trainer import Trainer

    torch.manual_seed(cfg.seed)
    model = load_policy(cfg)  # the warm start trains in [model].dtype, as ludic train does
    tokenizer = load_tokenizer(cfg)
    trainer_cfg = dataclasses.replace(
        cfg.trainer, lr=lr, learning_rate=None, sync_every_steps=0, eval_every_n_steps=None
    )
    source = OfflineBatchSource(items, batch_size=batch_size, shuffle=True, seed=cfg.seed)
    asyncio.run(Trainer(model=model, algo=make_sft(), batch_source=source, cfg=trainer_cfg).train(steps))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
