"""Trainer loop mechanics on a real tiny Qwen2 with fixed in-memory batches."""

from __future__ import annotations

import io
from collections.abc import Mapping

import pytest
import torch

from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import TrainerConfig
from ludic.training.loggers import JsonlLogger, PrintLogger
from ludic.training.loss import ReinforceLoss
from ludic.training.trainer import Trainer
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

from .onpolicy import NoCredit, tiny_model


def make_item(length: int, weight: float = 1.0, rid: str = "r0", **meta: object) -> SAWItem:
    ids = [(7 * i + length) % 60 + 2 for i in range(length)]
    return SAWItem(
        input_ids=ids,
        attention_mask=[1] * length,
        action_mask=[0, 0, 0] + [1] * (length - 3),
        weight=weight,
        meta={"rollout_id": rid, "total_reward": weight, **meta},
    )


ITEMS = [
    make_item(n, w, f"r{i}") for i, (n, w) in enumerate([(6, 1.0), (8, -0.5), (9, 2.0), (12, 1.0), (16, 0.5)])
]


class FixedBatchSource:
    """A BatchSource that returns the same macro-batch every step."""

    def __init__(self, items: list[SAWItem], meta: Mapping[str, object] | None = None) -> None:
        self.items = items
        self.meta = dict(meta or {"target_rollouts": len(items)})
        self.calls = 0

    async def next_batch(self) -> SAWBatch:
        self.calls += 1
        return SAWBatch(items=list(self.items), meta=dict(self.meta))


class RecordingPublisher:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, torch.Tensor], int | None]] = []

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.calls.append(({k: v.clone() for k, v in state_dict.items()}, version))


def reinforce() -> RLAlgorithm:
    return RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))


def make_trainer(model: torch.nn.Module | None = None, items: list[SAWItem] = ITEMS, **kw: object) -> Trainer:
    cfg = kw.pop("cfg", TrainerConfig(lr=1e-2, max_seq_len=32, micro_token_budget=64))
    return Trainer(
        model=model or tiny_model(),
        algo=kw.pop("algo", reinforce()),
        batch_source=FixedBatchSource(items),
        cfg=cfg,
        **kw,
    )


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_loss_goes_down_on_a_fixed_batch_and_stats_are_flat() -> None:
    pos = [make_item(n, 1.0, f"r{n}") for n in (6, 8, 10, 12)]
    trainer = make_trainer(items=pos)
    losses = [trainer.train_step_sync()["train/loss"] for _ in range(8)]
    assert losses[-1] < losses[0] - 1.0, losses
    stats = trainer.train_step_sync()
    assert trainer.step == 9
    assert stats["train/num_samples"] == 4.0 and stats["train/target_rollouts"] == 4.0
    assert stats["train/effective_rollouts"] == 4.0 and stats["train/avg_completion_length"] == 6.0
    assert stats["perf/real_tokens"] == 36.0 and stats["perf/step_seconds"] > 0
    assert stats["perf/tokens_per_second"] > 0 and stats["train/nonfinite_skipped"] == 0.0
    assert all(k.split("/", 1)[0] in ("train", "perf", "time") for k in stats)


def test_train_sync_runs_the_requested_number_of_steps() -> None:
    trainer = make_trainer()
    trainer.train_sync(num_steps=3)
    assert trainer.step == 3 and trainer.batch_source.calls == 3


def test_train_returns_every_steps_stats_in_order() -> None:
    trainer = make_trainer(tiny_model(0))
    history = trainer.train_sync(num_steps=3)
    assert len(history) == 3
    assert all("train/loss" in h and "perf/step_seconds" in h for h in history)
    again = make_trainer(tiny_model(0))
    assert [again.train_step_sync()["train/loss"] for _ in range(3)] == pytest.approx(
        [h["train/loss"] for h in history], rel=1e-6
    )


def test_gradients_do_not_depend_on_the_micro_batch_split() -> None:
    updates = []
    for budget in (80, 16):  # one micro-batch vs. four: [6, 8], [9], [12], [16]
        model = tiny_model(0)
        before = params_of(model)
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)
        cfg = TrainerConfig(max_seq_len=16, micro_token_budget=budget, max_grad_norm=None)
        stats = make_trainer(model, cfg=cfg, optimizer=sgd).train_step_sync()
        updates.append((stats, {k: before[k] - v for k, v in params_of(model).items()}))
    (stats_a, upd_a), (stats_b, upd_b) = updates
    assert (stats_a["perf/num_micro_batches"], stats_b["perf/num_micro_batches"]) == (1.0, 4.0)
    assert stats_a["train/loss"] == pytest.approx(stats_b["train/loss"], rel=1e-5)
    for name in upd_a:
        torch.testing.assert_close(upd_a[name], upd_b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_grad_norm_is_clipped_to_max_grad_norm() -> None:
    model = tiny_model(0)
    before = params_of(model)
    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, max_grad_norm=1e-3)
    stats = make_trainer(
        model, cfg=cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0)
    ).train_step_sync()
    step_norm = torch.sqrt(sum(((before[k] - v) ** 2).sum() for k, v in params_of(model).items()))
    assert stats["train/grad_norm"] > 1e-2  # reported before clipping
    assert float(step_norm) == pytest.approx(1e-3, rel=1e-3)


class NaNOnFirstCall:
    """A loss that diverges once (as a real loss can with a bad batch), then behaves."""

    def __init__(self) -> None:
        self.inner, self.calls = ReinforceLoss(old_logp_key=None), 0

    def compute(self, logits: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        self.calls += 1
        loss, stats = self.inner.compute(logits, batch)
        return (loss * float("nan"), stats) if self.calls == 1 else (loss, stats)


def test_nan_loss_skips_the_optimizer_step_and_is_reported() -> None:
    model = tiny_model(0)
    before = params_of(model)
    algo = RLAlgorithm(name="nan", credit_assigner=NoCredit(), loss=NaNOnFirstCall())
    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=128)  # one micro-batch: one compute call per step
    trainer = make_trainer(model, cfg=cfg, algo=algo)
    stats = trainer.train_step_sync()
    assert stats["train/nonfinite_skipped"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in params_of(model).items())
    assert trainer.optimizer.state == {}  # AdamW never stepped
    stats = trainer.train_step_sync()
    assert stats["train/nonfinite_skipped"] == 0.0
    assert all(torch.isfinite(v).all() for v in params_of(model).values())
    assert not all(torch.equal(before[k], v) for k, v in params_of(model).items())


def test_publisher_gets_filtered_weights_tagged_with_the_step() -> None:
    publisher = RecordingPublisher()
    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, sync_every_steps=2)
    keep = lambda name, tensor: "layers.1." in name  # noqa: E731
    trainer = make_trainer(cfg=cfg, publisher=publisher, param_filter=keep)
    trainer.train_sync(num_steps=4)
    assert [v for _, v in publisher.calls] == [2, 4]
    sent = publisher.calls[-1][0]
    expected = {k for k in trainer.model.state_dict() if "layers.1." in k}
    assert set(sent) == expected and len(expected) == 12
    for k in expected:
        assert torch.equal(sent[k], trainer.model.state_dict()[k])


def test_explicit_sync_without_publisher_is_an_error_but_the_default_is_not() -> None:
    with pytest.raises(ValueError, match="sync_every_steps=1 but no publisher"):
        make_trainer(cfg=TrainerConfig(max_seq_len=32, micro_token_budget=64, sync_every_steps=1))
    make_trainer(cfg=TrainerConfig(max_seq_len=32, micro_token_budget=64)).train_step_sync()


def test_empty_batch_raises_naming_the_source() -> None:
    with pytest.raises(
        ValueError, match=r"FixedBatchSource.next_batch\(\) returned an empty batch at step 1"
    ):
        make_trainer(items=[]).train_step_sync()


def test_max_lag_drops_items_whose_policy_version_lags() -> None:
    items = [
        make_item(6, rid="old", policy_version=0),
        make_item(8, rid="new", policy_version=2),
        make_item(9, rid="x"),
    ]
    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, max_lag=1)
    trainer = make_trainer(items=items, cfg=cfg)
    trainer.step = 2  # the trainer is at policy version 2: version 0 lags by 2 > max_lag
    stats = trainer.train_step_sync()
    assert stats["train/stale_items_dropped"] == 1.0 and stats["train/num_samples"] == 2.0


def test_preprocess_runs_once_per_step_and_an_emptied_batch_skips_the_step() -> None:
    seen = []

    def drop_all(batch: SAWBatch) -> SAWBatch:
        seen.append(len(batch.items))
        return SAWBatch(items=[], meta=batch.meta)

    model = tiny_model(0)
    before = params_of(model)
    algo = RLAlgorithm(
        name="r",
        credit_assigner=NoCredit(),
        loss=ReinforceLoss(old_logp_key=None),
        preprocess=drop_all,
    )
    stats = make_trainer(model, algo=algo).train_step_sync()
    assert seen == [5] and {k: v for k, v in stats.items() if not k.startswith("time/")} == {"train/empty_after_filter": 1.0}
    assert stats["time/step_seconds"] > 0  # the time spent (data, preprocessing) is still reported
    assert all(torch.equal(before[k], v) for k, v in params_of(model).items())


class RecordingEvaluator:
    def __init__(self) -> None:
        self.calls: list[int] = []

    async def evaluate(self, *, concurrency: int) -> dict[str, float]:
        self.calls.append(concurrency)
        return {"eval/accuracy": 0.25, "solve_rate": 0.5}


def test_an_evaluator_that_takes_a_step_is_given_the_trainers() -> None:
    class StepEvaluator:
        def __init__(self) -> None:
            self.steps: list[int] = []

        def evaluate(self, *, concurrency: int, step: int | None = None) -> dict[str, float]:
            self.steps.append(step)
            return {"accuracy": 1.0}

    class AnyKeywords(StepEvaluator):
        def evaluate(self, **kwargs) -> dict[str, float]:  # type: ignore[override]
            self.steps.append(kwargs["step"])
            return {"accuracy": 1.0}

    for evaluator in (StepEvaluator(), AnyKeywords()):
        cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, eval_every_n_steps=2)
        make_trainer(cfg=cfg, evaluator=evaluator).train_sync(num_steps=4)
        assert evaluator.steps == [2, 4]


def test_evaluator_runs_every_n_steps_and_logger_every_log_every() -> None:
    evaluator, out = RecordingEvaluator(), io.StringIO()
    cfg = TrainerConfig(
        max_seq_len=32, micro_token_budget=64, eval_every_n_steps=2, eval_concurrency=3, log_every=2
    )
    trainer = make_trainer(cfg=cfg, evaluator=evaluator, train_logger=PrintLogger(stream=out))
    history = trainer.train_sync(num_steps=4)
    last = history[-1]
    assert evaluator.calls == [3, 3]
    assert last["eval/accuracy"] == 0.25 and last["eval/solve_rate"] == 0.5
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 2", "step 4"]
    assert "eval/accuracy=0.2500" in lines[-1]


def test_reducers_and_jsonl_logger_see_the_trained_items(tmp_path) -> None:
    from ludic.training.stats import Reducer

    items = [make_item(6, rid="a", won=True), make_item(8, rid="b", won=False)]
    log_path = tmp_path / "metrics.jsonl"
    reducers = {
        "win_rate": Reducer(kind="count_true", source="won", normalize_by="rollouts", as_percent=True)
    }
    trainer = make_trainer(items=items, reducers=reducers, train_logger=JsonlLogger(log_path))
    stats = trainer.train_step_sync()
    assert stats["train/win_rate"] == 50.0
    assert '"step": 1' in log_path.read_text() and '"train/win_rate": 50.0' in log_path.read_text()


def test_sync_wrapper_refuses_to_run_inside_an_event_loop() -> None:
    import asyncio

    trainer = make_trainer()

    async def inside() -> None:
        trainer.train_step_sync()

    with pytest.raises(RuntimeError, match=r"use `await trainer\.train"):
        asyncio.run(inside())


def test_async_train_matches_the_sync_path() -> None:
    import asyncio

    a, b = make_trainer(tiny_model(0)), make_trainer(tiny_model(0))
    stats_async = asyncio.run(a.train(num_steps=2))[-1]
    stats_sync = b.train_sync(num_steps=2)[-1]
    assert a.step == b.step == 2
    assert stats_async["train/loss"] == pytest.approx(stats_sync["train/loss"], rel=1e-6)


def _with_own_actor_logps(model: torch.nn.Module, item: SAWItem) -> SAWItem:
    """Attach the model's own log-probs of the action tokens, as an in-sync inference engine would."""
    ids = torch.tensor([item.input_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(
            -1, ids[0, 1:, None]
        )[:, 0]
    actor = [float(logps[t - 1]) for t, m in enumerate(item.action_mask) if m]
    return SAWItem(
        item.input_ids, item.attention_mask, item.action_mask, item.weight, item.meta,
        SampleAttachments(actor_logps=ActorTokenLogps(actor)),
    )  # fmt: skip


def test_actor_logps_reach_the_loss_and_on_policy_ratio_is_one() -> None:
    model = tiny_model(0)
    items = [_with_own_actor_logps(model, it) for it in ITEMS]
    algo = RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss())
    stats = make_trainer(model, items=items, algo=algo).train_step_sync()
    assert stats["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["train/mismatch_abs_mean"] == pytest.approx(0.0, abs=1e-4)


def test_gradient_checkpointing_gives_the_same_update() -> None:
    updates = []
    for checkpointing in (False, True):
        model = tiny_model(0)
        before = params_of(model)
        cfg = TrainerConfig(
            max_seq_len=32, micro_token_budget=64, max_grad_norm=None, gradient_checkpointing=checkpointing
        )
        make_trainer(model, cfg=cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0)).train_step_sync()
        updates.append({k: before[k] - v for k, v in params_of(model).items()})
        assert model.is_activation_checkpointing is checkpointing
    for name in updates[0]:
        torch.testing.assert_close(updates[0][name], updates[1][name], rtol=1e-5, atol=1e-7, msg=name)


def test_preprocessed_batch_meta_and_surviving_items_drive_the_stats() -> None:
    def keep_first_two(batch: SAWBatch) -> SAWBatch:
        return SAWBatch(items=batch.items[:2], meta={**batch.meta, "zvp_dropped_groups": 3})

    algo = RLAlgorithm(
        name="r", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None), preprocess=keep_first_two
    )
    stats = make_trainer(algo=algo).train_step_sync()
    assert stats["train/zvp_dropped_groups"] == 3.0 and stats["train/target_rollouts"] == 5.0
    assert stats["train/num_samples"] == 2.0 and stats["train/effective_rollouts"] == 2.0


class ThreeBatches(FixedBatchSource):
    async def next_batch(self) -> SAWBatch:
        if self.calls == 3:
            raise StopAsyncIteration
        return await super().next_batch()


def test_train_without_num_steps_runs_until_the_source_is_exhausted() -> None:
    trainer = Trainer(
        model=tiny_model(), algo=reinforce(), batch_source=ThreeBatches(ITEMS),
        cfg=TrainerConfig(max_seq_len=32, micro_token_budget=64),
    )  # fmt: skip
    trainer.train_sync()
    assert trainer.step == 3


def test_kept_head_logits_give_the_same_update(monkeypatch: pytest.MonkeyPatch) -> None:
    import ludic.training.layout.forward as forward

    seen: list[bool] = []

    def spy(*args: object, keep_logits: bool = False, **kw: object) -> torch.Tensor:
        seen.append(keep_logits)
        return head_token_logps(*args, keep_logits=keep_logits, **kw)

    head_token_logps = forward.head_token_logps
    monkeypatch.setattr(forward, "head_token_logps", spy)
    updates = []
    for keep in (False, True):
        model = tiny_model(0)
        before = params_of(model)
        cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, max_grad_norm=None, keep_head_logits=keep)
        make_trainer(model, cfg=cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0)).train_step_sync()
        updates.append({k: before[k] - v for k, v in params_of(model).items()})
        assert seen and set(seen) == {keep}  # the output layer's tiles ran, keeping their logits or not
        seen.clear()
    for name in updates[0]:
        torch.testing.assert_close(updates[1][name], updates[0][name], rtol=1e-5, atol=1e-7, msg=name)
