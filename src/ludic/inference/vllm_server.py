"""``ludic.inference.vllm_server``, the spec's path, kept importable: the module now lives in ``ludic.inference.vllm.launcher``.

This name is that module (``sys.modules``), so its private names and patches reach it.
"""

import sys

from ludic.inference.vllm import launcher as _module

if __name__ == "__main__":
    _module.main()
else:
    sys.modules[__name__] = _module
