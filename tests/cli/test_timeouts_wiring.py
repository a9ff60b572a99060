"""``ludic train`` takes its bounds from ``[timeouts]``: the HTTP client, the publisher, the pipeline's Redis calls
and queue waits, and the step watchdog around the training loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from types import SimpleNamespace

from ludic.cli.pipeline_mode import build_pipeline_mode
from ludic.cli.run_config import train_steps
from ludic.cli.runtime import make_client, make_publisher
from ludic.config.schema import RunConfig
from ludic.training.pipeline.redis_server import RedisServer

BOUNDS = {"http_s": 7.5, "publish_s": 9.0, "redis_s": 2.5, "redis_reconnect_s": 4.0, "queue_wait_s": 11.0,
          "step_watchdog_s": 0.3}  # fmt: skip


def config(**extra: object) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "m"}, "env": {"name": "e"}, "timeouts": BOUNDS, **extra})


def test_the_server_client_and_its_publisher_take_the_http_and_publish_bounds() -> None:
    cfg = config(inference={"backend": "server", "server_url": "http://127.0.0.1:9"})
    client = make_client(cfg)
    assert client.timeout_s == 7.5
    assert make_publisher(cfg, client).timeout_s == 9.0


def test_the_pipeline_reader_takes_the_redis_and_queue_bounds() -> None:
    with RedisServer() as redis_server:
        cfg = config(pipeline={"enabled": True, "redis_url": redis_server.url, "run_id": "wiring"})
        mode = build_pipeline_mode(cfg, inner_publisher=None, vocab_size=16)
        _check_and_close(mode)


def _check_and_close(mode) -> None:
    try:
        source = mode.batch_source
        assert source.queue_wait_s == 11.0
        assert (source.stream._timeout_s, source.stream.reconnect_timeout_s) == (2.5, 4.0)
        assert (mode.publisher.call_timeout_s, mode.publisher.reconnect_timeout_s) == (2.5, 4.0)
    finally:
        asyncio.run(mode.batch_source.close())
        mode.close()


def stuck_in_a_collective(seconds: float) -> None:
    time.sleep(seconds)


class StuckTrainer:
    """A trainer whose one step blocks in ``stuck_in_a_collective`` for 1 s (what the watchdog must name)."""

    step = 0

    async def train(self, steps: int) -> None:
        await asyncio.to_thread(stuck_in_a_collective, 1.0)
        self.step += steps


def test_the_training_loop_runs_under_the_step_watchdog(caplog) -> None:
    async def close_pipeline() -> None:
        return None

    run = SimpleNamespace(cfg=config(steps=1), trainer=StuckTrainer(), logger=contextlib.nullcontext(),
                          pipeline=None, close_pipeline=close_pipeline)  # fmt: skip
    caplog.set_level(logging.ERROR, logger="ludic.training.watchdog")
    asyncio.run(train_steps(run))
    reports = [r.getMessage() for r in caplog.records]
    assert reports and "training step 1 (after step 0) has not advanced" in reports[0]
    assert "in stuck_in_a_collective" in reports[0]
    assert not any(t.name == "ludic-step-watchdog" for t in threading.enumerate())  # stopped with the loop
