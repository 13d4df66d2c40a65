"""Decoding: logits processors, strategies (greedy, sampling, beam, contrastive) and the decoding report."""

from tinylm.generate.config import STRATEGIES, SamplingConfig
from tinylm.generate.strategies import generate, generate_with

__all__ = ["STRATEGIES", "SamplingConfig", "generate", "generate_with"]
