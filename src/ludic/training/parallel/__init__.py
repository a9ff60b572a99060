"""Sharded training under ``torchrun``: FSDP2, the data-parallel group, JSON collectives, DCP
checkpoints, the rank-0 batch source, gathering full weights for publishing."""
