"""``ludic.inference.vllm_client``, the spec's path, kept importable: the module now lives in ``ludic.inference.vllm.client``.

This name is that module (``sys.modules``), so its private names and patches reach it.
"""

import sys

from ludic.inference.vllm import client as _module

sys.modules[__name__] = _module
