"""The CPU speed-ups: oneDNN linears, block attention over packed rows, the lean decoder, its shared-prefix KV cache,
the batched sampler, and Ludic's own C++ decoding matmul and attention (``native.py`` builds them). Each one
replaces a plain path it is tested against."""
