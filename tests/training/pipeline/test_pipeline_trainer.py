"""A Trainer fed by an actor through a real Redis stream: cursor in the checkpoint, trim after it, resume."""

from __future__ import annotations

import asyncio
import json

from transformers import AutoModelForCausalLM

from ludic.distributed import ClientPublisher
from ludic.testing import tiny_model_path
from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo
from ludic.training.pipeline import PipelineBatchSource, PipelineVersionPublisher, run_pipeline_actor


def _trainer(url, run_id, client, out_dir) -> Trainer:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    vocab_size = model.get_input_embeddings().num_embeddings
    source = PipelineBatchSource(redis_url=url, run_id=run_id, batch_size=8, vocab_size=vocab_size, max_staleness=1)
    return Trainer(
        model=model,
        algo=make_grpo(group_size=4),
        batch_source=source,
        publisher=PipelineVersionPublisher(ClientPublisher(client), redis_url=url, run_id=run_id),
        cfg=TrainerConfig(lr=1e-4, max_seq_len=64, micro_token_budget=2048, pad_token_id=0),
        checkpoint_config=CheckpointConfig(output_dir=str(out_dir), every_n_steps=2),
    )


async def test_trainer_checkpoints_the_stream_cursor_trims_after_it_and_resumes_there(
    redis_server, run_id, tiny_client, letter_source, tmp_path
):
    url = redis_server.url
    trainer = _trainer(url, run_id, tiny_client, tmp_path)
    stop = asyncio.Event()
    actor = asyncio.create_task(run_pipeline_actor(
        source=letter_source(tiny_client), redis_url=url, run_id=run_id, trainer_batch_size=8,
        max_staleness=1, stop=stop, policy_version_fn=tiny_client.get_policy_version,
    ))  # fmt: skip
    popped, next_batch = [], trainer.batch_source.next_batch

    async def recording_next_batch():
        batch = await next_batch()
        popped.extend(batch.items)
        return batch

    trainer.batch_source.next_batch = recording_next_batch
    stats = {}
    for _ in range(4):
        stats = await trainer.train_step()
        assert stats["train/pipeline/mean_staleness"] <= 1.0
    built = [k for it in popped for obj in (it, it.attachments.actor_logps)
             for k, v in obj.__dict__.items() if k.startswith("_list_") and v is not None]  # fmt: skip
    assert len(popped) == 32 and built == []  # the step trained from the popped arrays: no per-token list
    stop.set()
    pushed = (await asyncio.wait_for(actor, 30)).entry_ids
    source = trainer.batch_source
    assert stats["train/num_samples"] == 8.0 and stats["train/pipeline/trainer_version"] == 3.0
    assert tiny_client.policy_version == 4  # published every step, announced on the stream
    assert await source.stream.version() == 4
    state = json.loads((tmp_path / "step_000004" / "trainer_state.json").read_text())
    cursor = state["metadata"]["batch_source"]["last_id"]
    assert cursor == source.last_id and state["metadata"]["batch_source"]["consumed"] == 32
    left = [eid for eid, _ in await source.stream.read("0-0", count=1000, block_ms=10)]
    assert left == [eid for eid in pushed if eid > cursor]  # trimmed through the checkpointed cursor
    await source.close()

    resumed = _trainer(url, run_id, tiny_client, tmp_path)
    resumed.load_checkpoint()
    assert resumed.step == 4 and resumed.batch_source.last_id == cursor
    assert resumed.batch_source.consumed == 32
    await resumed.batch_source.close()
