"""One bad stream entry fails only itself: entries that decode but would break the step are refused on
arrival, counted by reason, passed by the cursor (so trimmed, never read again on resume)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from transformers import AutoModelForCausalLM

from ludic.testing import tiny_model_path
from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo
from ludic.training.pipeline.batch_source import PipelineBatchSource
from ludic.training.pipeline.checks import EntryLimits, check_item
from ludic.training.pipeline.codec import BadEntry, encode_item
from ludic.training.pipeline.stream import PipelineStream

VOCAB = 259  # the tiny model's


def _bad_items(make_item) -> list[tuple[str, object]]:
    """(reason, item): each decodes, and each crashed the step or made it non-finite before it was refused."""

    def with_meta(n, **meta):
        item = make_item(n)
        item.meta.update(meta)
        return item

    def with_ids(n, ids):
        return dataclasses.replace(make_item(n), input_ids=ids)

    return [
        ("out_of_vocab", with_ids(100, [1, 2, VOCAB, 7, 8])),  # one past the embedding's last row
        ("out_of_vocab", with_ids(101, [1, -3, 2, 7, 8])),
        ("nucleus_sampled", with_meta(102, sampling_top_p=0.9)),
        ("extreme_weight", make_item(103, weight=1e300)),
        ("extreme_weight", dataclasses.replace(make_item(104), token_weights=[1.0, 1e308])),
        ("bad_temperature", with_meta(105, sampling_temperature=float("nan"))),
        ("bad_temperature", with_meta(106, sampling_temperature=1e-45)),
    ]


async def _push(url: str, run_id: str, items) -> None:
    stream = PipelineStream(url, run_id)
    await stream.push([encode_item(it, run_id=run_id, item_id=f"item-{it.meta['n']}") for it in items])
    await stream.close()


def _expected_counts() -> dict[str, int]:
    return {"out_of_vocab": 2, "nucleus_sampled": 1, "extreme_weight": 2, "bad_temperature": 2}


async def test_entries_that_would_break_the_step_are_refused_counted_and_logged(
    redis_server, run_id, make_item, caplog
):
    bad = _bad_items(make_item)
    await _push(redis_server.url, run_id, [make_item(0), *[it for _, it in bad], make_item(1)])
    source = PipelineBatchSource(
        redis_url=redis_server.url, run_id=run_id, batch_size=2, vocab_size=VOCAB, version_fn=lambda: 0,
        block_ms=50,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="ludic.training.pipeline.batch_source"):
        batch = await source.next_batch()
    assert [it.meta["n"] for it in batch.items] == [0, 1]
    for reason, count in _expected_counts().items():
        assert batch.meta[f"pipeline/skipped_{reason}"] == float(count), reason
        assert sum(reason in r.getMessage() for r in caplog.records) == count, reason
    assert source.consumed == 9 and await source.stream.pending() == 0
    await source.close()


def test_the_limits_keep_greedy_and_ordinary_items_and_can_take_nucleus_items(make_item):
    limits = EntryLimits(VOCAB)
    for meta in ({"sampling_temperature": 0.0}, {"sampling_temperature": 0.7, "sampling_top_p": 1.0}, {}):
        item = make_item(0)
        item.meta.update(meta)
        check_item(item, limits)  # no BadEntry
    nucleus = make_item(0)
    nucleus.meta["sampling_top_p"] = 0.9
    with pytest.raises(BadEntry, match=r"sampling_top_p 0\.9"):
        check_item(nucleus, limits)
    check_item(nucleus, EntryLimits(VOCAB, allow_nucleus=True))
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        EntryLimits(0)


def _trainer(url, run_id, out_dir) -> Trainer:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    source = PipelineBatchSource(
        redis_url=url, run_id=run_id, batch_size=8, max_staleness=100, version_fn=lambda: 0,
        vocab_size=model.get_input_embeddings().num_embeddings, block_ms=50,
    )  # fmt: skip
    return Trainer(
        model=model,
        algo=make_grpo(group_size=4),
        batch_source=source,
        cfg=TrainerConfig(
            lr=1e-4, max_seq_len=64, micro_token_budget=2048, pad_token_id=0, sync_every_steps=0
        ),
        checkpoint_config=CheckpointConfig(output_dir=str(out_dir), every_n_steps=1),
    )


async def test_a_trainer_trains_the_good_items_around_bad_entries_and_a_resume_never_rereads_them(
    redis_server, run_id, make_item, tmp_path
):
    bad = [it for _, it in _bad_items(make_item)]
    good = [make_item(n, weight=1.0 if n % 2 else -1.0) for n in range(16)]
    await _push(redis_server.url, run_id, [*good[:3], *bad, *good[3:]])
    trainer = _trainer(redis_server.url, run_id, tmp_path)
    stats = await trainer.train_step()  # before: IndexError in the embedding, or a non-finite step
    assert stats["train/num_samples"] == 8.0 and stats["train/nonfinite_skipped"] == 0.0
    for reason, count in _expected_counts().items():
        assert stats[f"train/pipeline/skipped_{reason}"] == float(count), reason
    source = trainer.batch_source
    assert await source.stream.length() == 8  # the checkpoint of step 1 trimmed the bad entries with the rest
    await source.close()

    resumed = _trainer(redis_server.url, run_id, tmp_path)
    resumed.load_checkpoint()
    stats = await resumed.train_step()
    assert stats["train/num_samples"] == 8.0 and stats["train/nonfinite_skipped"] == 0.0
    for reason, count in _expected_counts().items():  # restored from the checkpoint, not met again
        assert stats[f"train/pipeline/skipped_{reason}"] == float(count), reason
    await resumed.batch_source.close()
