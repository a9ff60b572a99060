"""Hostile request bodies against the real server (a subprocess on loopback): each is a quick 4xx naming
what was wrong, never a 500, and costs the server little."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
ROUTES = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": [5, 6], "max_tokens": 2},
    "/inference/v1/generate": {"token_ids": [5, 6], "sampling_params": {"max_tokens": 2}},
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("hostile"), seed=0)
    with running_server(model_dir) as base:  # default limits: an 8 MB body
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c


def refusal(reply: httpx.Response) -> str:
    return reply.json()["error"]["message"]


def test_a_body_over_the_limit_is_a_413_before_it_is_read(client):
    body = json.dumps({"messages": [{"role": "user", "content": "a" * 10_000_000}], "max_tokens": 2}).encode()
    began = time.perf_counter()
    reply = client.post(CHAT, content=body, headers=JSON)
    assert reply.status_code == 413, reply.text[:300]
    assert "exceeds the server's limit of 8388608 bytes (raise it with --max-body-mb)" in refusal(reply)
    chunked = client.post(CHAT, content=iter([body[i : i + 1 << 20] for i in range(0, len(body), 1 << 20)]),
                          headers=JSON)  # fmt: skip
    assert chunked.status_code == 413  # no Content-Length: stopped at the limit while reading
    assert time.perf_counter() - began < 5.0  # before: 12.9 s of CPU for the first one


def test_a_chat_within_the_limit_but_too_long_for_the_context_is_a_quick_400(client):
    began = time.perf_counter()
    reply = client.post(CHAT, json={"messages": [{"role": "user", "content": "a" * 4_000_000}], "max_tokens": 2})
    assert reply.status_code == 400 and "max_position_embeddings 2048" in refusal(reply)
    assert time.perf_counter() - began < 3.0  # templating and tokenising 4 MB took ~10 s


@pytest.mark.parametrize("route", [*ROUTES, "/init_weight_transfer_engine", "/finish_weight_update"])
@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b"[" * 5000 + b"]" * 5000, "nested too deeply: at most 64 levels"),
        (json.dumps({"a": [[[[]]]] * 1, "b": json.loads("[" * 70 + "]" * 70)}).encode(), "at most 64 levels"),
        (b'{"weight_version": Infinity}', "contains Infinity: JSON numbers must be finite"),
        (b'{"temperature": NaN}', "contains NaN"),
        (b'{"max_tokens": 1e999}', "1e999, which overflows a float"),
        (b'{"seed": ' + b"7" * 5000 + b"}", "not valid JSON"),
        (b"\xff\xfe{", "not valid JSON"),
    ],
)
def test_malformed_json_is_a_400_naming_the_problem(client, route, raw, named):
    if route == "/finish_weight_update":
        client.post("/start_weight_update")  # so finish would read the version
    reply = client.post(route, content=raw, headers=JSON)
    assert reply.status_code == 400, reply.text[:300]
    assert named in refusal(reply)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("seed", 2**64, "seed must be a 64-bit signed int"),
        ("temperature", 1e-39, "below MIN_TEMPERATURE"),
        ("stop", ["s"] * 100_000, "at most MAX_STOP_STRINGS=64"),
        ("stop", ["s" * 5000], "at most MAX_STOP_CHARS=4096"),
    ],
)
def test_sampling_values_out_of_range_are_400s_naming_the_field(client, field, value, named):
    for route, base in ROUTES.items():
        params = base.get("sampling_params", base)
        body = {**base, "sampling_params": {**params, field: value}} if params is not base else {**base, field: value}
        began = time.perf_counter()
        reply = client.post(route, json=body)
        assert reply.status_code == 400 and named in refusal(reply), (route, reply.text[:300])
        assert time.perf_counter() - began < 3.0
    short = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 1})
    assert short.status_code == 200  # nothing of the refused request lingers


WRONG = [None, True, "x", 1.5, -1, 2**70, [], {}, [1, "a"], [[1]], {"a": 1}, [10**30]]
FIELDS = ["model", "messages", "prompt", "prompt_token_ids", "token_ids", "sampling_params", "max_tokens",
          "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "logprobs", "prompt_logprobs",
          "tools"]  # fmt: skip


@pytest.mark.slow
def test_no_field_of_a_generation_route_gives_a_500_whatever_its_type(client):
    served = set()
    for (route, base), field, value in itertools.product(ROUTES.items(), FIELDS, WRONG):
        targets = [base, base["sampling_params"]] if "sampling_params" in base else [base]
        for target in targets:
            body = json.loads(json.dumps(base))
            (body if target is base else body["sampling_params"])[field] = value
            reply = client.post(route, json=body)
            assert reply.status_code in (200, 400, 413, 422), (route, field, value, reply.text[:300])
            if reply.status_code == 200:
                served.add(route)
            else:
                assert refusal(reply)
    assert served == set(ROUTES)  # harmless values (an unknown model name, logprobs on) are still served
