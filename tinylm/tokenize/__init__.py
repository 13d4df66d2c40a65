"""Tokenizers: one `Tokenizer` facade over HF `tokenizers` BPE, tiktoken, characters and the from-scratch BPE."""

from tinylm.tokenize.tokenizer import (
    EOT,
    GPT2_PATTERN,
    STATE_FILE,
    TRAINED_SPECS,
    Tokenizer,
    build_tokenizer,
)

__all__ = ["EOT", "GPT2_PATTERN", "STATE_FILE", "TRAINED_SPECS", "Tokenizer", "build_tokenizer"]
