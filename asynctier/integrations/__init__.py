"""Bridges from inference servers to asynctier tiers.

Each module here imports its server's package, so none is imported by ``import asynctier``:
``asynctier.integrations.vllm`` needs vLLM installed (docs/vllm.md).
"""
