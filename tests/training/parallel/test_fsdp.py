"""FSDP2 training with real gloo process groups: ``torchrun --nproc_per_node=2`` subprocesses on loopback.

The worker (``fsdp_worker.py``) trains a real tiny Qwen2 on fixed seeded macro-batches of 7 items
(uneven per rank, some truncated, several micro-batches per rank, gradient clipping active).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from ludic.testing import torchrun_argv
from ludic.training.parallel.step import DataParallelGroup, balanced_share
from ludic.training.types import SAWItem

WORKER = Path(__file__).with_name("fsdp_worker.py")
pytestmark = pytest.mark.integration  # the process-group runs are slow-marked: ~1 min each here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_worker(model: Path, out: Path, *args: str, nproc: int = 2) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if nproc == 1:
        cmd = [sys.executable, str(WORKER)]
    else:
        cmd = torchrun_argv(out / "torchrun", f"--nproc_per_node={nproc}",
                            "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(WORKER))  # fmt: skip
    cmd += ["--model", str(model), "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def params(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "params.safetensors"))


def assert_close_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"parameters differ by {worst}"


def assert_trained_alike(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]
) -> None:
    """Two runs took the same optimisation steps, up to fp32 reduction order.

    Adam divides each gradient by its own root-mean-square: where clipping (max_grad_norm=1e-3) leaves an
    element's gradient near Adam's eps (1e-8), a last-bit difference in the reduction order (two ranks against
    one process, AVX2 against AVX-512 matmuls) moves that element by a visible fraction of lr (1e-2). On an AMD
    EPYC Zen 3 three steps gave one element 2.2e-5 apart. So each tensor's difference is held to a thousandth of
    how far training moved it (a wrong batch, scale or averaging makes them differ like the move itself), and no
    element may differ by a hundredth of one step's lr.
    """
    assert a.keys() == b.keys() and len(a.keys() & initial.keys()) >= len(a) - 1
    for name in a.keys() & initial.keys():  # a tied output layer is saved once, under the embedding's name
        moved = (a[name] - initial[name]).norm().item()
        apart = (a[name] - b[name]).norm().item()
        assert apart <= 1e-3 * moved + 1e-7, f"{name}: runs {apart:.3g} apart after moving {moved:.3g}"
    assert_close_params(a, b, atol=1e-4)


@pytest.fixture(scope="module")
def runs(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One process unsharded, and two FSDP2 ranks that also checkpoint after step 2 and export."""
    root = tmp_path_factory.mktemp("fsdp_runs")
    run_worker(model_dir, root / "one", "--steps", "3", nproc=1)
    run_worker(model_dir, root / "two", "--steps", "3", "--ckpt-dir", str(root / "ckpt"), "--save-at", "2",
               "--export", str(root / "export"))  # fmt: skip
    return {"root": root, "one": root / "one", "two": root / "two"}


@pytest.mark.slow
def test_two_ranks_train_exactly_like_one_process_on_the_same_global_batch(runs, model_dir):
    one = json.loads((runs["one"] / "result.json").read_text())["history"]
    two = json.loads((runs["two"] / "result.json").read_text())["history"]
    for a, b in zip(one, two, strict=True):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-4, abs=1e-7)
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-4)
        assert b["train/num_samples"] == a["train/num_samples"] == 7  # stats describe the global batch
        assert b["train/seq_len_truncated_rate"] == a["train/seq_len_truncated_rate"]
        assert b["perf/real_tokens"] == a["perf/real_tokens"]  # summed over ranks
        assert b["perf/rank0/real_tokens"] + b["perf/rank1/real_tokens"] == b["perf/real_tokens"]
        assert b["perf/rank0/real_tokens"] > 0 and b["perf/rank1/real_tokens"] > 0
    assert any(a["train/grad_norm"] > 1e-3 for a in one)  # clipping (max_grad_norm=1e-3) was exercised
    initial = load_file(str(model_dir / "model.safetensors"))
    trained_one, trained_two = params(runs["one"]), params(runs["two"])
    moved = max((trained_one[k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 1e-3  # training changed the weights far beyond the tolerance below
    assert_trained_alike(trained_one, trained_two, initial)


@pytest.mark.slow
def test_sharded_export_loads_with_from_pretrained(runs):
    model = AutoModelForCausalLM.from_pretrained(runs["root"] / "export")
    trained = params(runs["two"])
    state = model.state_dict()
    assert_close_params({k: state[k] for k in trained}, trained, atol=0.0)
    saved = sorted(p.name for p in (runs["root"] / "ckpt" / "step_000002").iterdir())
    shards = {"shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"}
    assert shards | {"shards.json", "trainer_state.json", "rng_rank0.json", "rng_rank1.json"} <= set(saved)
    assert not any(name.endswith((".distcp", ".metadata", ".pt")) for name in saved)  # no pickle anywhere


@pytest.mark.slow
def test_two_rank_checkpoint_resumes_with_identical_losses(runs, model_dir):
    out = runs["root"] / "resumed"
    resumed = run_worker(model_dir, out, "--steps", "1", "--ckpt-dir", str(runs["root"] / "ckpt"), "--resume")
    original = json.loads((runs["two"] / "result.json").read_text())["history"]
    assert resumed["step"] == 3
    assert resumed["history"][0]["train/loss"] == original[2]["train/loss"]
    assert resumed["history"][0]["train/grad_norm"] == original[2]["train/grad_norm"]
    assert_close_params(params(out), params(runs["two"]), atol=0.0)


class _Payload:
    """Unpickling this would create ``path`` (a stand-in for any code a planted file could run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


@pytest.mark.slow
def test_planted_pickle_in_any_checkpoint_file_is_refused_on_every_rank_and_runs_nothing(runs, model_dir):
    import pickle  # only to write the attacker's file

    source = runs["root"] / "ckpt" / "step_000002"
    marker = runs["root"] / "pwned"
    planted = []
    for name in sorted(p.name for p in source.iterdir()):
        folder = runs["root"] / "planted" / name
        shutil.copytree(source, folder)
        (folder / name).write_bytes(pickle.dumps(_Payload(marker)))
        planted.append(folder / name)
    out = runs["root"] / "planted_out"
    result = run_worker(model_dir, out, "--steps", "1", "--ckpt-dir", str(runs["root"] / "planted_ckpt"),
                        "--try-load", ",".join(str(p.parent) for p in planted))  # fmt: skip
    assert len(planted) >= 6 and len(result["load_errors"]) == len(planted)
    for path, error in zip(planted, result["load_errors"]):
        assert error is not None and str(path) in error, (path, error)
    assert not marker.exists()


@pytest.mark.slow
def test_lora_under_fsdp_publishes_the_same_merged_weights_as_one_process(model_dir, tmp_path):
    run_worker(model_dir, tmp_path / "one", "--steps", "2", "--lora", nproc=1)
    run_worker(model_dir, tmp_path / "two", "--steps", "2", "--lora")
    one, two = params(tmp_path / "one"), params(tmp_path / "two")
    assert not any("lora" in k or "base_layer" in k for k in two)  # base-model names only
    base = load_file(str(model_dir / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (two[q] - base[q]).abs().max() > 1e-3  # the adapter's delta is merged in
    assert_trained_alike(one, two, base)


def wait_healthy(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as reply:
                if json.loads(reply.read())["status"] == "ok":
                    return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not start: {proc.stdout.read().decode()[-2000:]}") from None
            time.sleep(0.3)


@pytest.mark.slow
def test_rank0_publishes_each_step_to_the_ludic_server_process(model_dir, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "ludic.inference.server", str(model_dir), "--port", str(port)]
    server = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url)
        run_worker(model_dir, tmp_path / "out", "--steps", "2", "--server-url", url)
        with urllib.request.urlopen(url + "/policy_version") as reply:
            assert json.loads(reply.read())["policy_version"] == 2
        prompt = [5, 6, 7, 8]
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt_token_ids": prompt,
                "max_tokens": 4, "temperature": 0.0, "logprobs": True, "return_token_ids": True}  # fmt: skip
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as reply:
            choice = json.loads(reply.read())["choices"][0]
    finally:
        server.terminate()
        server.wait(timeout=10)
    served = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    trained = AutoModelForCausalLM.from_pretrained(model_dir)
    trained.load_state_dict(params(tmp_path / "out"), strict=False)
    ids = torch.tensor([prompt + choice["token_ids"]])
    with torch.no_grad():
        logps = torch.log_softmax(trained(ids).logits.float(), dim=-1)[0]
    expected = [float(logps[len(prompt) - 1 + i, t]) for i, t in enumerate(choice["token_ids"])]
    assert served == pytest.approx(expected, abs=1e-4)


def item(n: int) -> SAWItem:
    return SAWItem(input_ids=[1] * n, attention_mask=[1] * n, action_mask=[0] + [1] * (n - 1), weight=1.0)


def test_balanced_share_partitions_every_item_once_with_similar_token_counts():
    items = [item(n) for n in (50, 3, 40, 7, 22, 9, 31, 12, 5)]
    shares = [balanced_share(items, r, 3) for r in range(3)]
    ids = sorted(id(it) for s in shares for it in s)
    assert ids == sorted(id(it) for it in items)  # every item on exactly one rank
    loads = [sum(len(it.input_ids) for it in s) for s in shares]
    assert max(loads) - min(loads) <= max(len(it.input_ids) for it in items) // 3
    assert [items.index(it) for it in shares[0]] == sorted(items.index(it) for it in shares[0])  # order kept


def test_one_process_group_hooks_are_the_identity():
    group = DataParallelGroup.for_model(torch.nn.Linear(2, 2))
    assert not group.active and group.is_main and group.grad_scale == 1.0
    items = [item(4), item(6)]
    mbs = group.plan(items, lambda share: [share])
    assert mbs == [items] and group.share_of(mbs[0], 2, 4) == 0.5
    assert group.used_items(items, items[:1], 3) == items[:1]


def test_items_cross_ranks_as_json_without_loss():
    from ludic.training.parallel.batch import item_from_json, item_to_json
    from ludic.training.types import ActorTokenLogps, SampleAttachments

    original = SAWItem(input_ids=[5, 6, 7], attention_mask=[1, 1, 1], action_mask=[0, 1, 1], weight=-0.25,
                       meta={"rollout_id": "r", "request_meta": {"group_id": 3}},
                       attachments=SampleAttachments(ActorTokenLogps([-0.5, -1.5])))  # fmt: skip
    again = item_from_json(json.loads(json.dumps(item_to_json(original))))
    assert again == original
    with pytest.raises(TypeError, match="JSON"):
        from ludic.training.parallel.collectives import _encode

        _encode({"bad": object()})
