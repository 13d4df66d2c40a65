"""Text the sampling commands read from their options: escapes in typed text (`unescape`), a prompt file
(generate's `--prompt_file`), a file of prompts one a line (sample-report's `--prompts_file`); `-` is standard
input."""

from __future__ import annotations

import re
from pathlib import Path

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
MAX_TEXT_BYTES = 256 * 2**20  # a prompt file or standard input read past this is no prompt (/dev/zero, a stream)


def unescape(text: str) -> str:
    r"""Turn the escape sequences a shell passes through literally into characters: "\n\n" -> two newlines,
    "\t" -> tab, "\r" -> carriage return, "\\" -> backslash. Any other backslash is kept as typed ("C:\xyz",
    "\alpha", a trailing "\"): Python's full escape syntax would fail on some and silently change others."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def read_prompt_file(path: str, prompt: str = "") -> str:
    """The text of ``path`` (``-``: standard input) as a prompt: decoded as UTF-8 exactly, less a byte-order mark
    and one trailing line end (an editor's, `echo`'s). One line for a prompt given twice (``prompt`` non-empty), a
    terminal as standard input (it would wait for text typed), a missing, unreadable, binary, undecodable or empty
    file."""
    if prompt:
        raise ValueError(f"--prompt and --prompt_file {path!r} both give the prompt; give one")
    text = read_text_option(path, "--prompt_file", "the prompt", "generate")
    text = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    if not text:
        raise ValueError(f"--prompt_file {_file_name(path)} is empty; give a file with the prompt, or leave out "
                         "--prompt_file to start from a fresh document")
    return text


def _file_name(path: str) -> str:
    return "standard input" if path == "-" else repr(path)


def read_text_option(path: str, flag: str, what: str, command: str) -> str:
    """The text of the file ``path`` given to ``flag`` (``-``: standard input) of ``command``, which reads ``what``
    from it, decoded as UTF-8 less a leading byte-order mark. One line for a terminal as standard input (it would
    wait for text typed), a closed one, and a missing, unreadable, binary or undecodable file."""
    import sys

    name = _file_name(path)
    if path == "-" and stdin_is_terminal():
        raise ValueError(f"{flag} - reads {what} from standard input, which is a terminal; pipe the text in (cat "
                         f"story.txt | tinylm {command} ... {flag} -) or give a file")
    if path == "-" and sys.stdin is None:
        raise ValueError(f"{flag} - reads {what} from standard input, which is closed; pipe the text in")
    try:
        if path != "-" and (Path(path).is_char_device() or Path(path).is_block_device()):  # (False when missing)
            raise ValueError(f"{flag} {name} is a device, not a text file (/dev/zero, /dev/urandom and the like never "
                             "end); give a text file, or - for standard input")
        if path == "-":
            data = getattr(sys.stdin, "buffer", sys.stdin).read(MAX_TEXT_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{flag} {name} cannot be read ({e.strerror or e}); give a text file, or - for standard "
                         "input") from None
    if len(data) > MAX_TEXT_BYTES:  # (a stream that never ends: it grew until the machine killed the process)
        raise ValueError(f"{flag} {name} holds more than {MAX_TEXT_BYTES // 2**20} MiB; {what} is read whole, and a "
                         "model sees at most its block_size tokens of it: give a shorter text file")
    data = data.encode("utf-8") if isinstance(data, str) else data  # a text stream with no buffer
    try:
        text = data.decode("utf-8-sig")  # a leading byte-order mark (Windows' Notepad writes one) is no text
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {name} is not UTF-8 text (byte {data[e.start:e.start + 1]!r} at byte "
                         f"{e.start}: a binary file, or text in another encoding); save it as UTF-8") from None
    if "\0" in text:
        raise ValueError(f"{flag} {name} is a binary file (a NUL byte at character {text.index(chr(0))}); give a "
                         "text file")
    return text


def stdin_is_terminal() -> bool:
    """Whether standard input is a terminal (a user would have to type the prompt); a closed one is not."""
    import sys

    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # closed
        return False


def read_prompts_file(path: str) -> list[str]:
    """The prompts in ``path`` (``-``: standard input), one a line, escapes such as ``\\n`` read (a prompt of
    several lines is one line of the file), blank lines skipped; one line for a file with none (`read_text_option`
    for the rest)."""
    # lines end at \n, \r\n or \r only: str.splitlines also ends one at a form feed, U+2028, \x1c... inside a prompt
    text = read_text_option(path, "--prompts_file", "the prompts", "sample-report")
    prompts = [unescape(line) for line in re.split(r"\r\n|\r|\n", text) if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts_file {_file_name(path)} holds no prompt (every line is blank); give one prompt a "
                         "line, or leave it out to start every sample from a fresh document")
    return prompts
