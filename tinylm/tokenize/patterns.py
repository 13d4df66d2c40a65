"""Facts about text that several stages share: the end-of-text token and GPT-2's pre-tokenization pattern."""

EOT = "<|endoftext|>"  # document separator in corpora, and the special token that ends a document

# GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols (each with an optional leading space), and
# whitespace runs that leave their last space to the next word
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Trainers count a pre-token longer than this as chunks of this many characters. Text without spaces (DNA, base64,
# minified code) is otherwise one pre-token of megabytes, and BPE training on it goes quadratic (2 MB: hours).
# Words in natural text are far shorter (the longest in tinyshakespeare is 16), so their training is unchanged;
# encoding never chunks, so the GPT-2 / tiktoken encodings stay exact.
TRAIN_PIECE_CHARS = 64
