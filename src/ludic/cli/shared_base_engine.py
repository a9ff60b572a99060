"""An embedded engine that starts on the trainer's frozen base tensors (a ``[lora]`` run, ``ludic.cli.lora``)."""

from __future__ import annotations

from typing import Any

from ludic.inference import TransformersChatClient


class SharedBaseEngine(TransformersChatClient):
    """A ``TransformersChatClient`` whose weights are, at first, the trainer's frozen base tensors.

    Adapter publishes never write them (served unmerged beside them, or folded into copies). A full update
    (merged weights: a publisher with ``lora="merged"``) would be copied into them and so into the trainer's
    base; it first gives the engine weights of its own (one copy, once), then loads as usual.
    """

    owns_weights = False

    def load_validated(self, params: Any, **kwargs: Any) -> str:
        if not self.owns_weights:  # equal values: a batch decoding meanwhile reads the same numbers
            for param in self.model.parameters():
                param.data = param.data.clone()
            self.owns_weights = True
        return super().load_validated(params, **kwargs)
