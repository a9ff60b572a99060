"""``ludic.training.batching.micro_batching``, the spec's path, kept importable: the module now lives in ``ludic.training.layout.micro_batching``.

This name is that module (``sys.modules``), so its private names and patches reach it.
"""

import sys

from ludic.training.layout import micro_batching as _module

sys.modules[__name__] = _module
