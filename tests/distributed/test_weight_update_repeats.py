"""A weight update takes each tensor once: a publisher re-sending a name is refused before any buffer is
taken for it (each repeat used to take a fresh receive buffer: memory without bound from one publisher, and
the served value left to arrival order). Against a real server subprocess, over shared memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from ludic.inference.weight_sync.packing import TensorMeta, update_info
from ludic.inference.weight_sync.weights import validate_metas
from ludic.testing.server_process import running_server

from .test_shared_memory_ownership import NORM, post, write_call

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def url(dirs: tuple[Path, Path]) -> Iterator[str]:
    with running_server(dirs[0], ["--transfer-timeout", "3"]) as base:
        assert post(base, "/init_weight_transfer_engine", {"init_info": {"backend": "shm"}}).status_code == 200
        yield base


def test_a_tensor_sent_twice_in_one_update_is_refused_and_the_update_still_finishes(url):
    version = httpx.get(url + "/policy_version").json()["policy_version"]
    update = post(url, "/start_weight_update", {}).json()["update_id"]
    call, _ = write_call(url, update, {NORM: torch.full((128,), 1.5)})
    assert post(url, "/update_weights", {"update_info": call, "update_id": update}).status_code == 200
    again = update_info([TensorMeta(NORM, "float32", (128,))], packed=True)
    for _ in range(3):  # reserved again after it arrived: refused, no buffer taken
        refused = post(url, "/ludic/reserve_weight_buffer", {"update_info": again, "update_id": update})
        assert refused.status_code == 400 and "already sent" in refused.json()["error"]["message"]
    done = post(url, "/finish_weight_update", {"weight_version": str(version + 1), "update_id": update})
    assert done.status_code == 200, done.text
    assert httpx.get(url + "/policy_version").json()["policy_version"] == version + 1


def test_a_name_reserved_twice_before_it_arrives_is_refused(url):
    update = post(url, "/start_weight_update", {}).json()["update_id"]
    info = update_info([TensorMeta(NORM, "float32", (128,))], packed=True)
    first = post(url, "/ludic/reserve_weight_buffer", {"update_info": info, "update_id": update})
    assert first.status_code == 200
    second = post(url, "/ludic/reserve_weight_buffer", {"update_info": info, "update_id": update})
    assert second.status_code == 400 and NORM in second.json()["error"]["message"]
    assert post(url, "/ludic/abort_weight_update", {"update_id": update}).status_code == 200


def test_validate_metas_names_the_repeat() -> None:
    target = {NORM: torch.zeros(128)}
    meta = [TensorMeta(NORM, "float32", (128,))]
    validate_metas(meta, target)
    with pytest.raises(ValueError, match="already sent"):
        validate_metas(meta, target, sent={NORM})
