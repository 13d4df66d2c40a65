"""Facts about text that several stages share: the end-of-text token and GPT-2's pre-tokenization pattern."""

EOT = "<|endoftext|>"  # document separator in corpora, and the special token that ends a document

# GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols (each with an optional leading space), and
# whitespace runs that leave their last space to the next word
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
