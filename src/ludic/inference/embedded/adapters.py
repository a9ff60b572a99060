"""Serving a LoRA adapter on the embedded engine: the pristine base kept, ``W = W_base + scaling * B @ A`` applied.

The simplest exact way to serve one adapter is to fold it into the weights the forward already reads:
the engine keeps a copy of each adapted layer's base weight and, under its weights lock (the same lock
and versioning as a full update), computes ``W = W_base + scaling * B @ A`` for every targeted layer into
a buffer no layer serves, then swaps those buffers in as the parameters' data, and the base back in on
layers the previous adapter targeted and this one does not. Nothing is visible before the swap, so an
adapter applies whole or not at all; one that fails its checks (names, shapes, finite values once cast,
the same base) is refused and the old weights keep serving.

Cost (a 100M model, rank 16 on q/k/v/o: 56 layers of 768x768): the product is ~1 GFLOP and the fold reads
the base and writes the buffer once (2 x 132 MB); two buffers per layer are kept from publish to publish
(the one served and the next), so no fresh pages fault in, and the layers are shared between two threads.
Memory: the base copy plus the two buffers, 3x the adapted weights (before: 2x, plus 1x during a publish).
Serving unmerged (``x W^T + s (x A^T) B^T``, ``adapter_serving="unmerged"``) makes a publish a 5 MB copy,
but costs every decoding step an extra product per adapted matmul (~2% of a 16-row step here): more than
the fold once a publish is followed by more than ~20 decoding steps, as RL rollouts are.

The other mode, ``adapter_serving="unmerged"`` (``unmerged.py``), serves the adapter beside the untouched
base: a publish only checks and copies A and B, and every forward adds ``(x A^T) B^T * scaling``.

One adapter at a time (the policy being trained): it applies to every request. A full update replaces
the base: the adapted layers are first put back to their base, then the update is loaded, and the
adapter is dropped (the next adapter publish applies on the new base).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ludic.inference.embedded.unmerged import UnmergedLayers, overflows, unmerged_unsupported
from ludic.inference.weight_sync.adapter_config import AdapterConfig, base_fingerprint, lora_names
from ludic.inference.weight_sync.packing import TensorMeta, dtype_name
from ludic.inference.weight_sync.weights import finite_as, first_non_finite, non_finite_message


@contextmanager
def one_thread() -> Iterator[None]:
    """Many small products and copies: on a busy CPU, waking every OpenMP thread for each one cost 10-20x the
    work itself (measured: 56 adds of 2.3 MB, 1.7 s on 2 threads vs 0.07 s on 1), so ``run_folds`` uses two
    Python threads of one OpenMP thread each instead. Per thread; restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


ADAPTER_SERVING = ("fold", "unmerged")
"""How the embedded engine serves an adapter: folded into the weights (default) or beside them (``unmerged.py``)."""


class AdapterRefused(ValueError):
    """An adapter that does not fit the served model (HTTP 400); nothing changed."""


class AdapterState:
    """The adapter served on ``model`` (if any): folded into its weights, the base weights kept under it, or
    (``mode="unmerged"``) beside them as hooks and terms on its layers."""

    def __init__(self, mode: str = "fold") -> None:
        if mode not in ADAPTER_SERVING:
            raise ValueError(f"adapter_serving must be one of {ADAPTER_SERVING}, got {mode!r}")
        self.mode = mode
        self.unmerged = UnmergedLayers()
        self.config: AdapterConfig | None = None
        self.pristine: dict[str, torch.Tensor] = {}  # weight name -> base weight, for the adapted layers
        self._buffers: dict[str, list[torch.Tensor]] = {}  # weight name -> its fold buffers (``_free_buffer``)
        self._fingerprint: str | None = None  # of the base, cached until a full update changes it
        self._metas: dict[tuple[tuple[str, ...], int], list[TensorMeta]] = {}  # (targets, rank) -> layout, the last one
        self._pool: ThreadPoolExecutor | None = None

    # ---- checks (no change) ---------------------------------------------------------------------
    def fingerprint(self, model: nn.Module, *, cache: bool = True) -> str:
        """The served base's ``base_fingerprint``, kept until a full update. ``cache=False``: the caller does not
        hold the weights lock (an update may be half copied), so the value is used once and not kept."""
        if self._fingerprint is not None:
            return self._fingerprint
        state = model.state_dict()
        fingerprint = base_fingerprint((k, self.pristine.get(k, v)) for k, v in state.items())
        if cache:
            self._fingerprint = fingerprint
        return fingerprint

    def expected_metas(self, model: nn.Module, config: AdapterConfig) -> list[TensorMeta]:
        """Names/dtypes/shapes ``config``'s tensors must have on this model (A ``[r, in]``, B ``[out, r]``);
        kept by targets and rank (a full update keeps every name, shape and dtype)."""
        key = (config.target_modules, config.rank)
        if key not in self._metas:
            state = model.state_dict()
            metas = []
            for module in config.target_modules:
                weight = state.get(f"{module}.weight")
                if weight is None or weight.dim() != 2:
                    raise AdapterRefused(f"adapter targets {module!r}, which is not a linear layer of the served model")
                reason = unmerged_unsupported(model, module) if self.mode == "unmerged" else _tied(model, module)
                if reason is not None:
                    raise AdapterRefused(reason)
                out_features, in_features = weight.shape
                a_name, b_name = lora_names(module)
                metas.append(TensorMeta(a_name, dtype_name(weight.dtype), (config.rank, in_features)))
                metas.append(TensorMeta(b_name, dtype_name(weight.dtype), (out_features, config.rank)))
            _check_size(config, metas, state)
            self._metas = {key: metas}  # the last layout only: a run publishes one, and a publisher cannot grow it
        _check_scalings(config, self._metas[key][::2])
        return self._metas[key]

    def check_base(self, model: nn.Module, config: AdapterConfig, *, locked: bool = True) -> None:
        """``locked``: the caller holds the engine's weights lock (else nothing is cached, see ``fingerprint``)."""
        served = self.fingerprint(model, cache=locked)
        if config.base_fingerprint != served:
            raise AdapterRefused(f"adapter {config.name!r} was trained on base {config.base_fingerprint}, the served "
                                 f"base is {served}: publish merged weights or serve the adapter's base model")  # fmt: skip

    def validate(
        self, model: nn.Module, tensors: Mapping[str, torch.Tensor], config: AdapterConfig, *, checked: bool = False
    ) -> None:
        """Names exactly the config's, shapes the model's, float, finite once cast, the same base. ``checked``:
        the caller checked all but the base against ``expected_metas`` already (the weight receiver does, as
        the bytes arrive); the base is checked here, under the weights lock, as a full update may have come
        in between."""
        if checked:
            return self.check_base(model, config)
        metas = {m.name: m for m in self.expected_metas(model, config)}
        if set(tensors) != set(metas):
            extra, lacking = sorted(set(tensors) - set(metas)), sorted(set(metas) - set(tensors))
            raise AdapterRefused(f"adapter tensors do not match its config: unexpected {extra[:3]}, missing {lacking[:3]}")
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != metas[name].shape:
                raise AdapterRefused(f"adapter {name!r} has shape {list(tensor.shape)}, expected {list(metas[name].shape)}")
            if not tensor.is_floating_point():
                raise AdapterRefused(f"adapter {name!r} has dtype {tensor.dtype}, expected a floating-point tensor")
        bad = first_non_finite(tensors, {n: m.dtype for n, m in metas.items()})
        if bad is not None:
            raise AdapterRefused(non_finite_message(bad, tensors[bad].dtype, metas[bad].dtype).replace("sync_weights", "adapter"))
        self.check_base(model, config)

    # ---- changes (the caller holds the engine's weights lock) -----------------------------------
    def apply(self, model: nn.Module, tensors: Mapping[str, torch.Tensor], config: AdapterConfig) -> None:
        """Fold the (validated) adapter into ``model``: every new weight computed into a buffer no layer
        serves, then all of them swapped in (``Parameter.data``), so a failure midway changes nothing.
        Unmerged: every term staged (copies of A and B), then all swapped in (``UnmergedLayers``)."""
        if self.mode == "unmerged":
            staged = self.unmerged.stage(model, tensors, config)
            for module, term in staged.items():  # the fold's check of the product, before anything is served
                if overflows(term):
                    raise AdapterRefused(f"adapter on {module!r} gives NaN or inf terms in {dtype_name(term.a.dtype)} "
                                         "(scaling * B @ A overflows); the old adapter keeps serving")  # fmt: skip
            self.unmerged.swap(model, staged)
            self.config = config
            return
        params = dict(model.named_parameters(remove_duplicate=False))
        targets = [f"{m}.weight" for m in config.target_modules]
        pristine = {n: self.pristine.get(n) for n in targets}  # a layer adapted for the first time: its base kept
        pristine = {n: w if w is not None else params[n].detach().clone() for n, w in pristine.items()}
        folds = [
            _Fold(self._free_buffer(name, pristine[name], params[name]), pristine[name],
                  *(tensors[n].detach().to(pristine[name].device, torch.float32) for n in lora_names(module)), scaling,
                  name)
            for name, module, scaling in zip(targets, config.target_modules, config.scalings, strict=True)
        ]  # fmt: skip
        run_folds(folds, self._helper() if torch.get_num_threads() > 1 else None)  # the thread budget is kept
        with torch.no_grad():  # nothing below can fail: names and shapes are the model's own
            for name in set(self.pristine) - set(targets):  # adapted before, not now: back to the base
                params[name].data = self.pristine[name]
                self._buffers.pop(name, None)
            for name, fold in zip(targets, folds, strict=True):
                params[name].data = fold.out
        self.pristine, self.config = pristine, config

    def _free_buffer(self, name: str, like: torch.Tensor, served: torch.Tensor) -> torch.Tensor:
        """A buffer for ``name``'s fold that the model does not serve: two per layer, kept from publish to
        publish (fresh memory faults its pages in on first write, which cost as much as the fold itself)."""
        pair = self._buffers.setdefault(name, [])
        for buffer in pair:
            if buffer.data_ptr() != served.data_ptr():
                return buffer
        buffer = torch.empty_like(like, memory_format=torch.contiguous_format)
        pair.append(buffer)
        return buffer

    def _helper(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-adapter-fold",
                                            initializer=torch.set_num_threads, initargs=(1,))  # fmt: skip
        return self._pool

    def restore_base(self, model: nn.Module) -> None:
        """Put the base back under every adapted layer and forget the adapter (before a full update)."""
        self.unmerged.clear(model)
        if self.pristine:
            params = dict(model.named_parameters(remove_duplicate=False))
            with torch.no_grad():
                for name, weight in self.pristine.items():
                    params[name].data = weight
        self.pristine, self._buffers, self.config, self._fingerprint = {}, {}, None, None


@dataclass(frozen=True)
class _Fold:
    """``out = base + scaling * B @ A`` for one layer (in float32, then cast to ``out``'s dtype, as before)."""

    out: torch.Tensor
    base: torch.Tensor
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scaling: float
    name: str = ""  # the weight's, for the refusal

    def run(self) -> None:
        if self.base.dtype == torch.float32 and self.out.dtype == torch.float32:
            torch.addmm(self.base, self.b, self.a, alpha=self.scaling, out=self.out)  # W + scaling * (B @ A)
        else:
            self.out.copy_(torch.addmm(self.base.float(), self.b, self.a, alpha=self.scaling))
        if not finite_as(self.out):  # finite A, B and scaling can still overflow (1e20 * 1e20): never served
            raise AdapterRefused(f"adapter folded into {self.name!r} gives NaN or inf weights in "
                                 f"{dtype_name(self.out.dtype)} (scaling * B @ A overflows); the old weights keep serving")  # fmt: skip


def _tied(model: nn.Module, module: str) -> str | None:
    """Why ``module``'s weight cannot be folded (None when it can): it is tied to another name (``lm_head`` to
    the embedding), so folding would adapt both, where peft adapts only ``module``."""
    params = dict(model.named_parameters(remove_duplicate=False))
    weight = params.get(f"{module}.weight")
    twins = [n for n, p in params.items() if p is weight and n != f"{module}.weight"]
    if twins:
        return (f"adapter targets {module!r}, whose weight is tied to {twins[0]!r}: folding would adapt both; "
                "serve it with adapter_serving='unmerged'")  # fmt: skip
    return None


def _check_size(config: AdapterConfig, metas: list[TensorMeta], state: Mapping[str, torch.Tensor]) -> None:
    """An adapter no larger than the model, the bound on a full update: a rank of ``10**9`` would have the
    server allocate A and B (terabytes) as their bytes arrive, and fold a product that large."""
    values, served = sum(math.prod(m.shape) for m in metas), sum(t.numel() for t in state.values())
    if values > served:
        raise AdapterRefused(f"adapter of rank {config.rank} on {len(config.target_modules)} layers holds {values} "
                             f"values, more than the served model's {served}: use a smaller rank")  # fmt: skip


MAX_SCALING = 1e4
"""The largest ``|scaling|`` served. peft's ``alpha / r`` (or ``alpha / sqrt(r)``) is 0.5 to 64 in practice;
``1e30`` times an A and B of ordinary size (0.01 to 1) stays finite in float32 yet swamps every weight, and
the model served is a broken, near-uniform one, with no error anywhere. Refused instead, naming the scaling."""


def _check_scalings(config: AdapterConfig, a_metas: list[TensorMeta]) -> None:
    """Every scaling finite in the served dtype (and float32, which the fold computes in): ``1e300`` becomes
    inf there, and every adapted weight (or unmerged term) NaN or inf; and at most ``MAX_SCALING``."""
    for module, scaling, meta in zip(config.target_modules, config.scalings, a_metas, strict=True):
        limit = min(torch.finfo(meta.dtype).max, torch.finfo(torch.float32).max)
        if not abs(scaling) <= limit:
            raise AdapterRefused(f"adapter scaling {scaling:g} of {module!r} is out of the served "
                                 f"{meta.dtype_name}'s range (|scaling| <= {limit:g})")  # fmt: skip
        if abs(scaling) > MAX_SCALING:
            raise AdapterRefused(f"adapter scaling {scaling:g} of {module!r} is above {MAX_SCALING:g} (peft's "
                                 "lora_alpha / r is 0.5 to 64 in practice): an adapter that large would serve a "
                                 "broken model; check lora_alpha and r")  # fmt: skip


def run_folds(folds: list[_Fold], helper: ThreadPoolExecutor | None) -> None:
    """Every fold, on this thread and ``helper``'s if given (one OpenMP thread each, see ``one_thread``), taking the
    next layer from a shared queue: both cores on a quiet CPU, and no waiting on a thread the OS descheduled
    on a busy one. Returns once both are done (an error stops the rest and is raised)."""
    queue = deque(folds)

    def drain() -> None:
        try:
            while True:
                queue.popleft().run()
        except IndexError:
            return
        except BaseException:
            queue.clear()
            raise

    on_cpu = bool(folds) and folds[0].out.device.type == "cpu"
    helping = helper.submit(drain) if helper is not None and on_cpu and len(folds) > 1 else None
    try:
        with one_thread():
            drain()
    finally:
        if helping is not None:
            helping.result()
