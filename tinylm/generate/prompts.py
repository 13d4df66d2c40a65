"""A prompt as the user typed it, into ids: text in UTF-8 (also typed under LC_ALL=C), and the start of a fresh
document when it is empty (the end-of-text token, else a newline)."""

from __future__ import annotations

import sys


def default_prompt(tokenizer) -> tuple[str, list[int]]:
    """(text shown, ids): the end-of-text token when the tokenizer has one (a fresh document), else a newline."""
    if tokenizer.eos_id is not None:
        return "", [tokenizer.eos_id]
    try:
        ids = tokenizer.encode("\n")
    except ValueError:
        ids = []
    if not ids:
        raise ValueError("this tokenizer has no end-of-text token and cannot encode '\\n' to start from; "
                         "pass a prompt")
    return "\n", ids


def encode_prompt(tokenizer, text: str) -> tuple[str, list[int]]:
    """(text shown, ids) of a user prompt; an empty one starts a fresh document as `default_prompt` does."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:  # UTF-8 typed under LC_ALL=C: Python decoded the argument as ASCII, keeping each byte as a surrogate
            text = text.encode(sys.getfilesystemencoding(), "surrogateescape").decode("utf-8")
        except UnicodeError:
            pass
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes the shell could not decode (Python keeps them as lone surrogates)
        bad = text[e.start].encode("utf-8", "surrogateescape")
        raise ValueError(f"the prompt is not valid UTF-8 (byte {bad!r} at character {e.start}); pass text in "
                         "UTF-8") from None
    ids = tokenizer.encode(text) if text else []
    return (text, ids) if ids else default_prompt(tokenizer)
