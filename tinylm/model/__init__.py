"""The GPT itself: architecture only (no Lightning, no optimizer, no I/O)."""

from tinylm.model.gpt import GPT, GPTConfig, GPTShape, KVCache, build_attention_mask

__all__ = ["GPT", "GPTConfig", "GPTShape", "KVCache", "build_attention_mask"]
