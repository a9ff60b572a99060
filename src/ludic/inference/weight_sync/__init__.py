"""Receiving weights on the inference side: staging, packing, checks, shared memory, process groups,
pausing generation; the layouts here are shared with the sending side (``ludic.distributed``)."""
