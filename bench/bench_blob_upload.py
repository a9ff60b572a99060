"""Uploading a weight blob to Ludic's server: the body as one ``bytes`` vs in pieces (what ``sync_weights`` sends).

``VLLMChatClient.sync_weights`` POSTs a model as one safetensors blob to ``/ludic/update_weights_blob``. httpcore
sends a ``bytes`` body by slicing off what each socket send took, a copy of the rest of the body every time, so
the upload is quadratic in the model's size; sent as ``memoryview`` pieces of ``UPLOAD_PIECE_BYTES`` it is one
pass. Per round, interleaved, against one real server (``python -m ludic.inference.server``) of the model:
- "whole": the blob POSTed as one ``bytes`` (what ``sync_weights`` sent before);
- "pieces": ``VLLMChatClient.sync_weights`` itself (the same blob, built inside the timing).
Both are timed from the state dict to the server's reply, which comes after the server loaded the weights.
Run: ``.venv/bin/python bench/bench_blob_upload.py [MODEL_DIR] [--rounds 3]`` (default: the prepared
SmolLM2-135M-Instruct, ``ludic models pull smollm2-135m-instruct``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx


def upload_whole(url: str, state: dict, version: int) -> float:
    """The old upload: the safetensors blob as one ``bytes`` body."""
    from safetensors.torch import save

    from ludic.inference.vllm._weights import _unshared_cpu

    started = time.perf_counter()
    blob = save(_unshared_cpu(state))
    reply = httpx.post(f"{url}/ludic/update_weights_blob?version={version}", content=blob, timeout=600,
                       headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    reply.raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="a transformers folder (default: SmolLM2-135M)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from ludic.inference.vllm.client import VLLMChatClient
    from ludic.models.pull import prepared_path
    from ludic.testing.server_process import running_server

    model_dir = args.model or str(prepared_path("smollm2-135m-instruct"))
    state = dict(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    times: dict[str, list[float]] = {"whole": [], "pieces": []}
    with running_server(model_dir) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True)
        version = 0
        for _ in range(args.rounds):
            for name in times:
                version += 1
                if name == "whole":
                    times[name].append(upload_whole(url, state, version))
                else:
                    started = time.perf_counter()
                    client.sync_weights(state, version=version)
                    times[name].append(time.perf_counter() - started)
                print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
    whole, pieces = (statistics.median(times[k]) for k in ("whole", "pieces"))
    print(f"{model_dir}: {nbytes / 2**20:.0f} MiB of state dict, {args.rounds} rounds interleaved")
    print(f"median upload: whole body {whole:.2f} s, in pieces {pieces:.2f} s: {whole / pieces:.1f}x faster")


if __name__ == "__main__":
    main()
