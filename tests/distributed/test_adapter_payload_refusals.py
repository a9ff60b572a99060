"""What an adapter publish cannot carry is refused on the trainer's side, naming the way out."""

from __future__ import annotations

import pytest
from peft import LoraConfig

from ludic.distributed import adapter_payload
from ludic.testing.lora import trained_lora_model


def test_several_active_adapters_are_refused_not_published_as_the_first(dirs):
    """peft's forward adds every active adapter; the payload took the first one, and the server then served a
    model the trainer never ran."""
    model = trained_lora_model(dirs[0], ["q_proj"], seed=1)
    model.add_adapter("second", LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj"], init_lora_weights=False))
    model.base_model.set_adapter(["default", "second"])
    with pytest.raises(ValueError, match=r"adapters \['default', 'second'\] are all active.*lora='merged'"):
        adapter_payload(model)
    model.base_model.set_adapter("second")
    assert adapter_payload(model).config.name == "second"


@pytest.mark.parametrize("extra, fix", [({"bias": "lora_only"}, "lora='merged'"), ({"bias": "all"}, "lora='merged'"),
                                        ({"lora_bias": True}, "lora_bias=True.*lora='merged'")])  # fmt: skip
def test_an_adapter_that_trains_biases_is_refused(dirs, extra, fix):
    """peft trains the biases too (base layers' or lora_B's): the payload, A and B only, dropped them, and the
    server served the untrained biases."""
    with pytest.raises(ValueError, match=rf"also trains biases.*{fix}"):
        adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1, **extra))
