"""Property-based tests of the server's adapter bodies (issue 37): a LoRA adapter as a safetensors blob
(``POST /ludic/update_weights_blob``) and as a peft folder (``POST /v1/load_lora_adapter``), each a well-formed
adapter with hostile changes drawn by hypothesis (config fields of any JSON type, huge or non-finite values,
tensors of other shapes or dtypes, missing or extra tensors, cut or corrupt headers, version strings).

Invariant: the reply is a 400 naming what was refused, with nothing served changed; or a 200, and then the
body was well formed and what is served (the unmerged terms, the config, the version) is exactly what it
carried. Never a 500, never a hang (each request has a timeout). The app is Ludic's real one on loopback,
its engine in this process so the served terms can be read.
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load, save

from ludic.distributed import adapter_payload
from ludic.inference import TransformersChatClient
from ludic.inference.server.app import build_app
from ludic.inference.weight_sync.adapter_config import ADAPTER_METADATA_KEY, AdapterConfig, AdapterPayload
from ludic.inference.weight_sync.adapter_files import (
    PEFT_PREFIX,
    VERSION_METADATA_KEY,
    WEIGHTS_FILE,
    write_adapter_folder,
)
from ludic.kernels.cpu.lean_weights import LORA_ATTR
from ludic.testing.lora import trained_lora_model

OCTET = {"Content-Type": "application/octet-stream"}
TIMEOUT_S = 20.0  # the bound on one request: a body that hangs the server fails the property


class Served:
    """Ludic's app for an in-process unmerged engine, on 127.0.0.1 in a thread of its own."""

    def __init__(self, model_dir: Path) -> None:
        self.engine = TransformersChatClient(model_dir, adapter_serving="unmerged")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(build_app(self.engine))
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        self.http = httpx.Client(base_url=self.url, timeout=TIMEOUT_S)  # one connection kept: no setup per example

    async def _start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    def close(self) -> None:
        self.http.close()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def state(self) -> tuple[int, Any, dict[str, tuple[torch.Tensor, torch.Tensor, float]]]:
        terms = {n: getattr(m, LORA_ATTR) for n, m in self.engine.model.named_modules() if hasattr(m, LORA_ATTR)}
        return self.engine.policy_version, self.engine.adapter.config, {n: (t.a, t.b, t.scaling) for n, t in terms.items()}


@pytest.fixture(scope="module")
def served(dirs: tuple[Path, Path]) -> Iterator[Served]:
    server = Served(dirs[0])
    yield server
    server.close()


@pytest.fixture(scope="module")
def good(dirs: tuple[Path, Path]) -> AdapterPayload:
    return adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1, rank=2))


# ---- hostile changes ----------------------------------------------------------------------------------------

JSON_ATOMS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2, -1, 1e4, 1e30, -1e30, 1e300, 1e-30, 0.5, -0.0, 4.0]),
    st.sampled_from(["nan", "inf", "-inf"]).map(float), st.text(max_size=8),
    st.sampled_from([" 8", "8", "+8", "8_0", "\u0668", "4", "q_proj", "model.layers.0.self_attn.q_proj"]),
)  # fmt: skip
JSON_VALUES = st.recursive(JSON_ATOMS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)  # fmt: skip
CONFIG_KEYS = ["rank", "alpha", "target_modules", "scalings", "base_fingerprint", "name", "other"]


@st.composite
def config_change(draw: st.DrawFn) -> tuple[str, str, Any]:
    key = draw(st.sampled_from(CONFIG_KEYS))
    if draw(st.booleans()) and key != "other":
        return ("del", key, None)
    if key == "scalings" and draw(st.booleans()):  # one scaling changed, the list kept
        return ("scaling", key, draw(JSON_ATOMS))
    return ("set", key, draw(JSON_VALUES))


@st.composite
def tensor_change(draw: st.DrawFn) -> tuple[str, int, Any]:
    kind = draw(st.sampled_from(["scale", "nan", "dtype", "shape", "drop", "extra"]))
    which = draw(st.integers(0, 7))
    if kind == "scale":
        return (kind, which, draw(st.sampled_from([1e-30, 1e-3, 0.0, -1.0, 1e3, 1e19, 1e20, 1e30])))
    if kind == "nan":
        return (kind, which, draw(st.sampled_from([float("nan"), float("inf"), -float("inf")])))
    if kind == "dtype":
        return (kind, which, draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.bool])))
    return (kind, which, None)


def apply_config(config: dict[str, Any], changes: list[tuple[str, str, Any]]) -> dict[str, Any]:
    config = json.loads(json.dumps(config))
    for op, key, value in changes:
        if op == "del":
            config.pop(key, None)
        elif op == "scaling" and isinstance(config.get("scalings"), list) and config["scalings"]:
            config["scalings"][0] = value
        else:
            config[key] = value
    return config


def apply_tensors(tensors: dict[str, torch.Tensor], changes: list[tuple[str, int, Any]]) -> dict[str, torch.Tensor]:
    tensors = {k: v.clone() for k, v in tensors.items()}
    for kind, which, value in changes:
        if not tensors:
            break
        name = sorted(tensors)[which % len(tensors)]
        t = tensors[name]
        if kind == "scale":
            tensors[name] = t * value
        elif kind == "nan" and t.is_floating_point() and t.numel():
            t.view(-1)[0] = value
        elif kind == "dtype":
            tensors[name] = t.to(value)
        elif kind == "shape":
            tensors[name] = t[:-1].contiguous() if t.shape[0] > 1 else torch.cat([t, t])
        elif kind == "drop":
            del tensors[name]
        elif kind == "extra":
            tensors[name.replace("lora_A", "lora_C").replace("lora_B", "lora_D")] = t.clone()
    return tensors


def well_formed(config: dict[str, Any], tensors: dict[str, torch.Tensor], good: AdapterPayload) -> bool:
    """What the server may serve: a config of the right types (no bool for a number, no coerced name) on this
    base, every scaling finite and at most 1e4, tensors exactly the config's names, floating, the right shapes."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    targets, scalings = config.get("target_modules"), config.get("scalings")
    if not (isinstance(config.get("rank"), int) and not isinstance(config["rank"], bool) and config["rank"] == good.config.rank
            and number(config.get("alpha")) and isinstance(targets, list) and isinstance(scalings, list)
            and targets == list(good.config.target_modules) and len(scalings) == len(targets)
            and all(number(s) and abs(s) <= 1e4 for s in scalings)
            and config.get("base_fingerprint") == good.config.base_fingerprint
            and isinstance(config.get("name", "default"), str)):  # fmt: skip
        return False
    expected = {f"{m}.lora_{x}.weight" for m in targets for x in "AB"}
    return set(tensors) == expected and all(
        t.is_floating_point() and t.shape == good[n].shape and bool(torch.isfinite(t.float()).all()) for n, t in tensors.items()
    )


def assert_serves(served: Served, config: dict[str, Any], tensors: dict[str, torch.Tensor], version: int, name: str) -> None:
    """What is served is exactly what the body carried (the tensors cast to the served dtype)."""
    policy_version, served_config, terms = served.state()
    assert policy_version == version
    assert served_config.to_json() == {**AdapterConfig.from_json(config).to_json(), "name": name}
    for module, scaling in zip(config["target_modules"], config["scalings"]):
        a, b, s = terms[module]
        assert s == float(scaling)
        assert torch.equal(a, tensors[f"{module}.lora_A.weight"].to(a.dtype))
        assert torch.equal(b, tensors[f"{module}.lora_B.weight"].to(b.dtype))


def blob_parts(blob: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The adapter config and tensors a blob really holds, read here independently of the server."""
    (size,) = struct.unpack("<Q", blob[:8])
    metadata = json.loads(blob[8 : 8 + size])["__metadata__"]
    return json.loads(metadata[ADAPTER_METADATA_KEY]), load(blob)


def assert_unchanged(served: Served, before: tuple) -> None:
    version, config, terms = served.state()
    assert (version, config) == before[:2] and terms.keys() == before[2].keys()
    assert all(terms[n][2] == before[2][n][2] and torch.equal(terms[n][0], before[2][n][0]) for n in terms)


def corrupt(blob: bytes, how: tuple[str, int]) -> bytes:
    kind, at = how
    if kind == "cut":
        return blob[: at % max(len(blob), 1)]
    if kind == "flip" and len(blob) > 8:
        (size,) = struct.unpack("<Q", blob[:8])
        i = 8 + at % max(size, 1)
        return blob[:i] + bytes([blob[i] ^ 0x5A]) + blob[i + 1 :]
    if kind == "size":
        return struct.pack("<Q", at * 7919 + 1) + blob[8:]
    return blob


BLOB_CORRUPTION = st.one_of(st.just(("none", 0)), st.tuples(st.sampled_from(["cut", "flip", "size"]), st.integers(0, 10**6)))


@given(configs=st.lists(config_change(), max_size=2), tensors=st.lists(tensor_change(), max_size=2),
       raw=st.one_of(st.none(), st.text(max_size=20)), broken=BLOB_CORRUPTION)  # fmt: skip
def test_adapter_blob_is_refused_naming_why_or_served_exactly(served, good, configs, tensors, raw, broken):
    config = apply_config(good.config.to_json(), configs)
    sent = apply_tensors({k: v.contiguous() for k, v in good.items()}, tensors)
    metadata = {ADAPTER_METADATA_KEY: raw if raw is not None else json.dumps(config)}
    blob = corrupt(save(sent, metadata=metadata), broken)
    before = served.state()
    reply = served.http.post("/ludic/update_weights_blob", content=blob, headers=OCTET)
    assert reply.status_code in (200, 400), reply.text
    if reply.status_code == 400:
        assert reply.json()["error"]["message"].startswith("weights rejected: "), reply.text
        assert_unchanged(served, before)
        return
    config, tensors = blob_parts(blob)  # what the accepted blob holds (a flipped header byte may still parse)
    assert well_formed(config, tensors, good), (config, reply.text)
    assert_serves(served, config, tensors, before[0] + 1, str(config.get("name", "default")))


HOSTILE_VERSIONS = [" 8", "8 ", "+8", "8_0", "\u0668", "-1", "-0", "", "1e3", "9" * 30, "0x10", str(2**63), "3.0"]
VERSIONS = st.one_of(st.none(), st.sampled_from(HOSTILE_VERSIONS), st.integers(0, 3))  # an int: served version + it


@given(configs=st.lists(config_change(), max_size=2), tensors=st.lists(tensor_change(), max_size=2), version=VERSIONS,
       extra_file=st.booleans())  # fmt: skip
def test_adapter_folder_is_refused_naming_why_or_served_exactly(served, good, configs, tensors, version, extra_file):
    from safetensors.torch import save_file

    config = apply_config(good.config.to_json(), configs)
    sent = apply_tensors({k: v.contiguous() for k, v in good.items()}, tensors)
    before = served.state()
    if isinstance(version, int):
        version = str(before[0] + version)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_adapter_folder(good, Path(tmp) / "adapter", version=0)
        metadata = {ADAPTER_METADATA_KEY: json.dumps(config), **({VERSION_METADATA_KEY: version} if version is not None else {})}
        save_file({PEFT_PREFIX + k: v for k, v in sent.items()}, str(folder / WEIGHTS_FILE), metadata=metadata)
        if extra_file:
            (folder / "notes.txt").write_text("ignored")
        reply = served.http.post("/v1/load_lora_adapter", json={"lora_name": "p", "lora_path": str(folder)})
    assert reply.status_code in (200, 400), reply.text
    if reply.status_code == 400:
        assert reply.json()["error"]["message"].strip(), reply.text
        assert_unchanged(served, before)
        return
    assert version is None or (version.isascii() and version.isdigit()), version
    assert well_formed(config, sent, good), config
    assert_serves(served, config, sent, before[0] + 1 if version is None else int(version), "p")


NORMS = ["model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"]
QUERY_VERSIONS = st.one_of(st.none(), st.sampled_from([*HOSTILE_VERSIONS, "abc", "1.5"]), st.integers(0, 2))


@given(tensors=st.lists(tensor_change(), max_size=2), broken=BLOB_CORRUPTION, version=QUERY_VERSIONS,
       big=st.sampled_from([None, 1e300, -1e39, 1e38]))  # fmt: skip
def test_weight_blob_is_refused_naming_why_or_served_exactly(served, tensors, broken, version, big):
    """A plain (not adapter) update of a few weights: refused whole, or exactly its values (cast) are served."""
    model = served.engine.model.state_dict()
    sent = apply_tensors({n: (model[n].detach().clone() * 1.5 + 0.25).contiguous() for n in NORMS}, tensors)
    if big is not None and sent:  # a float64 value that is finite there but not in the served float32
        name = sorted(sent)[0]
        sent[name] = sent[name].double()
        sent[name].view(-1)[0] = big
    blob = corrupt(save(sent), broken)
    before = served.state()
    before_weights = {n: model[n].detach().clone() for n in NORMS}
    query = "" if version is None else f"?version={before[0] + version if isinstance(version, int) else version}"
    reply = served.http.post("/ludic/update_weights_blob" + query, content=blob, headers=OCTET)
    assert reply.status_code in (200, 400), reply.text
    now = served.engine.model.state_dict()
    if reply.status_code == 400:
        assert reply.json()["error"]["message"].strip(), reply.text
        assert served.state()[0] == before[0] and all(torch.equal(now[n], w) for n, w in before_weights.items())
        return
    held = load(blob)
    assert version is None or isinstance(version, int), version
    assert held and set(held) <= set(model)
    for name, value in held.items():
        assert value.is_floating_point() and value.shape == model[name].shape
        assert torch.isfinite(value.to(now[name].dtype)).all()
        assert torch.equal(now[name], value.to(now[name].dtype))
    assert served.state()[0] == (before[0] + 1 if version is None else before[0] + version)
