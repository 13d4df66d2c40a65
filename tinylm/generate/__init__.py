"""Decoding: logits processors, strategies (greedy, sampling, beam, contrastive), speculative and constrained decoding,
and the decoding report."""

from tinylm.generate.config import STRATEGIES, SamplingConfig

__all__ = ["STRATEGIES", "SamplingConfig", "generate", "generate_with"]


def __getattr__(name: str):
    # imported on first use: the strategies need torch (seconds to import), which the decoding options that every
    # command's parser reads (tinylm.generate.options, tinylm.cli.commands) never do
    if name in ("generate", "generate_with"):
        from tinylm.generate import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
