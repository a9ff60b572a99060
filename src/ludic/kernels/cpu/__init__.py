"""The CPU speed-ups: oneDNN linears, block attention over packed rows, the lean decoder, its shared-prefix KV cache
and the batched sampler. Each one replaces a plain path it is tested against."""
