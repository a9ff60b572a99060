"""``ludic.training.credit_assignment``, the spec's path, kept importable: the module now lives in ``ludic.training.credit.assigners``.

This name is that module (``sys.modules``), so its private names and patches reach it.
"""

import sys

from ludic.training.credit import assigners as _module

sys.modules[__name__] = _module
