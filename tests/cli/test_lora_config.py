"""``[lora]`` in ``ludic train``: checked by ``--dry-run``; the policy trains only its adapters, the embedded engine
serves them on the trainer's own frozen base tensors, checkpoints hold (and resume) the adapter, and ``ludic
export`` merges it into a folder plain transformers loads."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ludic.cli import main
from ludic.config import load_config

from .run_configs import write_run_config

pytestmark = pytest.mark.integration

LORA = '[lora]\nrank = 4\nalpha = 8\ntargets = ["q_proj", "v_proj"]\n'


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _config(folder: Path, model: Path, *, steps: int = 2, lora: str = LORA, extra: str = "") -> Path:
    """A 2-step letter-repeat run warm-started by 2 SFT steps of the adapter (so it differs from zero)."""
    demos = folder / "demos.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    demos.write_text("".join(json.dumps({"prompt": f"Repeat {c}", "answer": c * 2}) + "\n" for c in "ab"))
    sft = f'[sft]\nsteps = 2\nbatch_size = 2\nlr = 5e-2\ndemonstrations = "{demos}"\n'
    return write_run_config(folder, model, steps=steps, eval_episodes=2, lr=1e-2, tables=sft + lora + extra)


def _metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[1, 80, 90, 100, 2, 1, 70, 71, 72, 73]])
    with torch.no_grad():
        return model(ids).logits


def test_lora_run_from_toml_serves_checkpoints_and_exports(tmp_path: Path, tiny_model: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = _config(tmp_path, tiny_model, extra="[checkpoint]\nevery_n_steps = 1\n")
    assert main(["train", str(config)]) == 0

    records = _metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    model_bytes = sum(4 * t.numel() for t in load_file(tiny_model / "model.safetensors").values())
    for r in records:  # the engine's sampling log-probs are the trainer's peft model's: it served the adapter
        assert r["train/mismatch_abs_mean"] < 1e-4, r
        assert 0 < r["perf/publish_bytes"] < 0.1 * model_bytes  # the adapter, not the model

    checkpoint = tmp_path / "out" / "checkpoints" / "step_000002"
    names = {p.name for p in checkpoint.iterdir()}
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names  # the adapter alone
    adapter = load_file(checkpoint / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert all(("q_proj" in k or "v_proj" in k) for k in adapter)
    assert max(v.abs().max().item() for k, v in adapter.items() if "lora_B" in k) > 0  # trained from B = 0

    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), checkpoint
    ).eval()
    base_logits = _logits(AutoModelForCausalLM.from_pretrained(tiny_model))
    assert (_logits(peft_model) - base_logits).abs().max() > 1e-3  # the adapter changes the model

    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "out"), str(out)]) == 0  # the run folder: its latest checkpoint
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not hasattr(plain, "peft_config")
    torch.testing.assert_close(_logits(plain), _logits(peft_model), atol=1e-5, rtol=0)
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}

    # untouched weights are the base's bit for bit; the adapted ones are W + scaling * B @ A
    base_state, merged = load_file(tiny_model / "model.safetensors"), load_file(out / "model.safetensors")
    for key, value in base_state.items():
        if "q_proj.weight" in key or "v_proj.weight" in key:
            module = key.removesuffix(".weight")
            a = adapter[f"base_model.model.{module}.lora_A.weight"]
            b = adapter[f"base_model.model.{module}.lora_B.weight"]
            torch.testing.assert_close(merged[key], value + 2.0 * b @ a, atol=1e-6, rtol=0)
        elif key in merged:
            assert torch.equal(merged[key], value), key


@pytest.mark.parametrize(
    ("publish", "serving", "shared"),
    [("adapter", "unmerged", "all"), ("adapter", "fold", "unadapted"), ("merged", "unmerged", "none")],
)
def test_engine_shares_the_frozen_base_and_serves_the_trained_adapter(
    tmp_path: Path, tiny_model: Path, publish: str, serving: str, shared: str
) -> None:
    from transformers import AutoModelForCausalLM

    from ludic.cli.run_config import build_train_run, train_steps
    from ludic.cli.warm_start import start_of_run

    lora = f'{LORA}publish = "{publish}"\nserving = "{serving}"\n'
    cfg = load_config(_config(tmp_path, tiny_model, lora=lora))
    original = load_file(tiny_model / "model.safetensors")

    async def run_it() -> None:
        run = build_train_run(cfg)
        try:
            await start_of_run(run)  # evaluation, then 2 SFT steps of the adapter
            await train_steps(run)
            policy, engine = run.trainer.model, run.client
            base = dict(policy.get_base_model().named_parameters())
            trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
            assert trainable and all("lora_" in n for n in trainable)
            optimised = {id(p) for group in run.trainer.optimizer.param_groups for p in group["params"]}
            assert optimised == {id(p) for p in policy.parameters() if p.requires_grad}  # the adapter alone
            # adapters published: one frozen base in the process (folded: the adapted layers are the engine's own)
            base_ptrs = {p.data_ptr() for p in base.values()}
            served = dict(engine.model.named_parameters())
            on_base = {n for n, p in served.items() if p.data_ptr() in base_ptrs}
            adapted = {n for n in served if re.search(r"(q_proj|v_proj)\.weight$", n)}
            assert on_base == {"all": set(served), "unadapted": set(served) - adapted, "none": set()}[shared]
            assert engine.adapter_serving == serving
            for name, value in original.items():  # the base never moved
                key = re.sub(r"(q_proj|v_proj)\.(weight|bias)$", r"\1.base_layer.\2", name)
                assert torch.equal(base[key].detach(), value), name
            # the engine serves the trained adapter: its forward equals the trainer's peft model's
            assert engine.policy_version == 2
            policy.eval()
            torch.testing.assert_close(_logits(engine.model), _logits(policy), atol=1e-5, rtol=0)
            assert (
                _logits(engine.model) - _logits(AutoModelForCausalLM.from_pretrained(tiny_model))
            ).abs().max() > 1e-3
        finally:
            await run.close()

    asyncio.run(run_it())


def test_resume_restores_and_publishes_the_adapter(tmp_path: Path, tiny_model: Path, capsys) -> None:
    checkpoint = "[checkpoint]\nevery_n_steps = 1\n"
    assert main(["train", str(_config(tmp_path, tiny_model, steps=2, extra=checkpoint))]) == 0
    saved = load_file(tmp_path / "out" / "checkpoints" / "step_000002" / "adapter_model.safetensors")
    assert main(["train", str(_config(tmp_path, tiny_model, steps=3, extra=checkpoint))]) == 0
    assert "resuming at step 2" in capsys.readouterr().out
    records = _metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    # step 3 sampled from the restored adapter (not the base, not a fresh adapter): log-probs agree
    assert records[-1]["train/mismatch_abs_mean"] < 1e-4
    assert (
        saved.keys()
        == load_file(tmp_path / "out" / "checkpoints" / "step_000003" / "adapter_model.safetensors").keys()
    )


def _dry_run_error(config: Path, capsys) -> str:
    assert main(["train", str(config), "--dry-run"]) == 2
    return capsys.readouterr().err


def test_dry_run_checks_lora(tmp_path: Path, tiny_model: Path, capsys, monkeypatch) -> None:
    ok = _config(tmp_path / "ok", tiny_model)
    assert main(["train", str(ok), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["lora"]["targets"] == ["q_proj", "v_proj"]

    err = _dry_run_error(
        _config(tmp_path / "t", tiny_model, lora='[lora]\ntargets = ["q_proj", "qkv"]\n'), capsys
    )
    assert "[lora].targets: 'qkv' names no module" in err and "q_proj" in err and "gate_proj" in err

    err = _dry_run_error(_config(tmp_path / "r", tiny_model, lora="[lora]\nrank = 0\n"), capsys)
    assert "rank must be >= 1" in err
    err = _dry_run_error(_config(tmp_path / "d", tiny_model, lora="[lora]\ndropout = 1.0\n"), capsys)
    assert "dropout must be in [0, 1)" in err
    err = _dry_run_error(_config(tmp_path / "e", tiny_model, lora="[lora]\ntargets = []\n"), capsys)
    assert "targets is empty" in err
    err = _dry_run_error(_config(tmp_path / "p", tiny_model, lora='[lora]\npublish = "delta"\n'), capsys)
    assert "publish" in err and "adapter" in err
    server = '[lora]\nserving = "fold"\n[inference]\nbackend = "server"\nserver_url = "http://127.0.0.1:9"\n'
    err = _dry_run_error(_config(tmp_path / "s", tiny_model, lora=server), capsys)
    assert "[lora].serving" in err and "--adapter-serving" in err

    monkeypatch.setitem(__import__("sys").modules, "peft", None)  # peft not installed: import peft fails
    err = _dry_run_error(_config(tmp_path / "n", tiny_model), capsys)
    assert "[lora] needs peft" in err and "ludic[peft]" in err


def test_shipped_lora_config_validates(capsys) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / "configs" / "letter_repeat_lora.toml"
    assert main(["train", str(shipped), "--dry-run", "--steps", "3"]) == 0
    lora = json.loads(capsys.readouterr().out)["lora"]
    assert lora == {"rank": 8, "alpha": 16.0, "targets": "all-linear", "dropout": 0.0, "rslora": False,
                    "publish": "adapter", "serving": "unmerged"}  # fmt: skip


def test_a_full_update_never_writes_the_shared_base(tmp_path: Path, tiny_model: Path) -> None:
    """A merged publish reaching the shared engine (any publisher with lora="merged") gives the engine its own
    weights first: the trainer's frozen base keeps its values, the engine serves the update."""
    from ludic.cli.lora import make_shared_engine
    from ludic.cli.runtime import load_policy
    from ludic.training._lora import merged_state_dict

    cfg = load_config(_config(tmp_path, tiny_model))
    policy = load_policy(cfg)
    engine = make_shared_engine(cfg, policy)
    base = {n: p.detach().clone() for n, p in policy.get_base_model().named_parameters()}
    update = {k: v + 0.5 for k, v in merged_state_dict(policy).items()}
    engine.sync_weights(update, version=1)
    for name, param in policy.get_base_model().named_parameters():
        assert torch.equal(param.detach(), base[name]), name
    served = engine.model.state_dict()
    assert all(torch.equal(served[k], v) for k, v in update.items())


def test_a_lora_checkpoint_as_model_path_is_served_merged(tmp_path: Path, tiny_model: Path) -> None:
    """``ludic eval --model <LoRA checkpoint>``: the engine serves base + adapter merged, every token's log-prob the
    peft model's (loaded by transformers as is, its LoRA layers ran in the prefill only: decoding used the base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ludic.cli.runtime import make_client
    from ludic.inference import SamplingConfig

    assert (
        main(
            ["train", str(_config(tmp_path, tiny_model, steps=1, extra="[checkpoint]\nevery_n_steps = 1\n"))]
        )
        == 0
    )
    checkpoint = tmp_path / "out" / "checkpoints" / "step_000001"
    cfg = load_config(tmp_path / "run.toml")
    cfg.model.path = str(checkpoint)
    engine = make_client(cfg)
    prompt = [1, 80, 90, 100, 2, 1, 70]
    reply, _ = asyncio.run(engine.complete_ids(prompt, SamplingConfig(temperature=1.0, max_tokens=6, seed=3), return_logprobs=True))  # fmt: skip
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), checkpoint
    ).eval()
    ids = torch.tensor([prompt + reply.completion_token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(peft_model(ids).logits[0, len(prompt) - 1 : -1], -1)
    expected = logprobs.gather(1, ids[0, len(prompt) :, None])[:, 0]
    torch.testing.assert_close(torch.tensor(reply.completion_logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.slow  # a server subprocess: ~30 s on 2 shared cores
def test_lora_run_publishes_adapters_to_ludics_server(tmp_path: Path, model_dir: Path, base_url: str) -> None:
    """backend "server": the SFT and RL steps publish the adapter over HTTP (Ludic's server, a subprocess), which
    samples from exactly the trainer's peft model."""
    server = base_url.removesuffix("/v1")
    extra = f'[inference]\nbackend = "server"\nserver_url = "{server}"\n'
    assert main(["train", str(_config(tmp_path, model_dir, extra=extra))]) == 0
    records = _metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    model_bytes = sum(4 * t.numel() for t in load_file(model_dir / "model.safetensors").values())
    for r in records:
        assert r["train/mismatch_abs_mean"] < 1e-4, r  # the adapter trained by SFT, served by the server
        assert 0 < r["perf/publish_bytes"] < 0.1 * model_bytes
