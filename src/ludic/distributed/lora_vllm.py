"""``VLLMLoraPublisher``: a LoRA run's adapter to ``vllm serve --enable-lora`` through vLLM's documented routes.

Each publish writes the adapter as a peft folder (``ludic.inference.weight_sync.adapter_files``) under ``adapter_dir``
(a path the server can read: the same host, or a shared file system) and calls ``POST
/v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}`` (vLLM needs
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); generation requests pick the adapter with
``model=<lora_name>``. The first publish loads the name, later ones replace it in place
(``load_inplace: true``). Folders older than the last ``keep`` are removed.

vLLM keeps no weight version for an adapter: the version is written into the folder's metadata (Ludic's
server serves it as the weight version; vLLM ignores it), and the trainer's own count is the version
of record against vLLM. Ludic's server implements the same two routes, which is what the tests run.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from time import perf_counter
from typing import Any

from torch import Tensor

from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.inference.weight_sync.adapter_files import write_adapter_folder


class VLLMLoraPublisher:
    """PolicyPublisher for a peft model's adapter (``lora_publish = "adapter"``: the trainer hands it one)."""

    lora_publish = "adapter"

    def __init__(self, client: Any, adapter_dir: str | Path, *, lora_name: str = "ludic-policy", keep: int = 2,
                 base_model: str = "", timeout_s: float = 120.0) -> None:  # fmt: skip
        if keep < 1 or not lora_name:
            raise ValueError(f"keep must be >= 1 and lora_name non-empty, got keep={keep}, lora_name={lora_name!r}")
        if any(c in lora_name for c in "/\\\0"):  # the folders are adapter_dir/<lora_name>-v<N>, later deleted
            raise ValueError(f"lora_name {lora_name!r} must be one folder name (no '/', '\\' or NUL): its adapter "
                             "folders would land outside adapter_dir")  # fmt: skip
        self.client, self.lora_name, self.keep = client, lora_name, keep
        self.adapter_dir, self.base_model, self.timeout_s = Path(adapter_dir), base_model, timeout_s
        self._loaded = False
        self._written: list[Path] = []
        self._count = 0
        self.last_stats: dict[str, float] = {}

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        if not isinstance(state_dict, AdapterPayload):
            raise TypeError("VLLMLoraPublisher publishes LoRA adapters: train a peft model (the trainer then hands "
                            f"it an AdapterPayload), got {type(state_dict).__name__}")  # fmt: skip
        self._count += 1
        t0 = perf_counter()
        tag = f"v{version}" if version is not None else f"n{self._count}"
        folder = write_adapter_folder(state_dict, self.adapter_dir / f"{self.lora_name}-{tag}", version=version,
                                      base_model=self.base_model)  # fmt: skip
        t1 = perf_counter()
        try:
            self.client.load_lora_adapter_sync(self.lora_name, str(folder.resolve()), load_inplace=self._loaded,
                                               timeout_s=self.timeout_s)  # fmt: skip
        except BaseException:  # refused (or lost): the folder serves nothing; left, it was never deleted
            shutil.rmtree(folder, ignore_errors=True)
            self._written = [p for p in self._written if p != folder]
            raise
        self._loaded = True
        self._written = [p for p in self._written if p != folder] + [folder]
        for old in self._written[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._written = self._written[-self.keep :]
        nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
        self.last_stats = {"publish_tensors": float(len(state_dict)), "publish_bytes": float(nbytes),
                           "publish_write_s": t1 - t0, "publish_control_s": perf_counter() - t1}  # fmt: skip
