"""Adapters that build publishers for specific inference backends."""

from ludic.distributed.adapters.vllm import create_vllm_publisher

__all__ = ["create_vllm_publisher"]
