"""With ``--api-key``, every route that changes state (the LoRA adapter routes included) needs the token:
all of the app's POST routes are tried over real HTTP on 127.0.0.1, so a route added later is covered too."""

from __future__ import annotations

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from ludic.inference import TransformersChatClient
from ludic.inference.server.app import build_app


async def test_every_post_route_without_the_token_is_401_and_changes_nothing(dirs):
    engine = TransformersChatClient(dirs[0])
    app = build_app(engine, api_key="k")
    posts = sorted({r.resource.canonical for r in app.router.routes() if r.method == "POST"})
    assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/start_weight_update"} <= set(posts)
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
        for path in posts:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                async with session.post(server.make_url(path), json={"lora_name": "x", "lora_path": "/tmp"},
                                        headers=headers) as reply:  # fmt: skip
                    assert reply.status == 401, path
    assert engine.policy_version == 0 and not engine.gate.paused and engine.adapter.config is None
