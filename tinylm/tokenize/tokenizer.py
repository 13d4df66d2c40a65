"""Tokenizer facade: one class over four backends (`tinylm.tokenize.backends`), chosen by a spec string.

Specs (`--data.tokenizer`):
    bpe               byte-level BPE trained on the corpus with Hugging Face `tokenizers` (GPT-2 pre-tokenizer)
    scratch-bpe       the same idea, trained by tinylm's own `tinylm.tokenize.bpe.ByteLevelBPE`
    char              one id per character of the corpus (nanoGPT's shakespeare_char)
    tiktoken:NAME     a pretrained tiktoken encoding (gpt2, r50k_base, cl100k_base, ...)
    tiktoken:PATH     a local `.tiktoken` rank file, GPT-2 pattern, `<|endoftext|>` = the highest rank + 1
    PATH              a Hugging Face `tokenizer.json`, a directory written by `Tokenizer.save`, or a folder of
                      GPT-2's vocab.json + merges.txt

`encode` treats its input as plain text: a special-token string in the text is encoded as ordinary characters, so
user text can never inject an end-of-text id. Specials are appended by id (see `tinylm.data`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tinylm.errors import UnavailableError
from tinylm.tokenize.backends import (
    BACKENDS,
    CharBackend,
    FormatError,
    HFBackend,
    ScratchBackend,
    TiktokenBackend,
    parse_ranks,
    ranks_to_text,
)
from tinylm.tokenize.patterns import EOT, GPT2_PATTERN, TRAIN_PIECE_CHARS

STATE_FILE = "tinylm_tokenizer.json"
STATE_VERSION = 1
TRAINED_SPECS = ("bpe", "scratch-bpe", "char")
EOS_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
"""Special tokens read as the end of a document, first found wins: GPT-2's, Llama 3's, SentencePiece's, Gemma's."""
VALID_SPECS = "bpe, scratch-bpe, char, tiktoken:NAME (e.g. tiktoken:gpt2), tiktoken:PATH.tiktoken, or a path to a " \
              "tokenizer.json / saved tokenizer directory / folder of vocab.json + merges.txt"


def changed_file_message(spec: str, was: str, now: str, *, resume: bool = True) -> str:
    """Why a resume (``resume``) or a validation is refused when the tokenizer file its spec names holds another
    tokenizer than the checkpoint's (``was`` and ``now``: the two fingerprints): the file changed since the run."""
    fix = ("put the run's file back, or move it away (a resume that finds no file there uses the checkpoint's own "
           "copy, unless --data.tokenizer is typed)" if resume else "leave --data.tokenizer out (of the command and "
           "its --config): tinylm validate then uses the checkpoint's own")
    path = spec.removeprefix("tiktoken:")
    changed = "its file changed since"
    if path not in TIKTOKEN_SIZES and not Path(path).is_absolute():  # resumed from another folder: another file
        changed += f", or the relative path names another file from this working folder ({os.getcwd()})"
    return (f"data.tokenizer {spec!r} is not the tokenizer the checkpoint was trained with under that name "
            f"(fingerprint {was[:12]}, now {now[:12]}): {changed}; {fix}")


# ---------------------------------------------------------------------------------------------------- facade
def _token_ids(ids: Iterable[int]) -> list[int]:
    """`ids` as Python ints: ints, numpy or 0-d integer tensors; a float, str or bool is a TypeError naming it."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"Tokenizer.decode takes a sequence of int ids; got {type(ids).__name__} {ids[:40]!r}")
    if hasattr(ids, "tolist"):  # a tensor or an array: its values at once (not a 0-d tensor per element)
        ids = ids.tolist()
        ids = ids if isinstance(ids, list) else [ids]
    out = []
    for i in ids:
        if isinstance(i, bool):
            raise TypeError(f"Tokenizer.decode takes int ids; got the bool {i}")
        try:
            out.append(operator.index(i))
        except TypeError:
            raise TypeError(f"Tokenizer.decode takes int ids; got {type(i).__name__} {i!r:.40}") from None
    return out


class Tokenizer:
    """Text <-> token ids, whatever the backend. Build one with `build_tokenizer(spec, ...)`."""

    def __init__(self, backend: Any, spec: str) -> None:
        self._b = backend
        self.spec = spec
        self._fingerprint: str | None = None
        self._vocab_size: int | None = None
        self._check_specials()

    def _check_specials(self) -> None:
        """Refuse special ids outside the vocabulary, shared, or a normal token's too (an EOS on ': each ' ends one)."""
        specials, size = self.special_tokens, self.vocab_size
        for name, i in specials.items():  # (ByteLevelBPE, scratch-bpe's, refuses these itself)
            token = getattr(self._b, "normal_token", lambda i: None)(i) if isinstance(i, int) else None
            why = (f"outside its vocabulary of {size:,} ids" if not isinstance(i, int) or not 0 <= i < size
                   else "which another special token has too" if list(specials.values()).count(i) > 1
                   else f"which the normal token {token!r} has too (that text would read as {name!r})"
                   if token not in (None, name) else None)
            if why:
                raise ValueError(f"the tokenizer's special token {name!r} has id {i!r}, {why}; its file is damaged or "
                                 "was edited")

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, read as plain text (special-token strings in it are not specials)."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode takes one str; got {type(text).__name__}: for many texts use "
                            "encode_batch(texts)")
        return self._b.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` over many texts, on all cores where the backend can."""
        if isinstance(texts, str):  # (a str is an iterable of one-character texts)
            raise TypeError(f"Tokenizer.encode_batch takes a list of texts; got one str {texts[:40]!r}: use "
                            "encode(text) or encode_batch([text])")
        texts = list(texts)
        for bad in (t for t in texts if not isinstance(t, str)):
            raise TypeError(f"Tokenizer.encode_batch takes a list of str; one is {type(bad).__name__} {bad!r:.60}")
        return self._b.encode_batch(texts)

    def encode_arrays(self, texts: list[str]) -> list:
        """`encode_batch` for a dataset build: each text's ids as a list or a numpy array (the char kind's table
        lookup, vectorized), whichever its backend makes fastest."""
        if (encode_array := getattr(self._b, "encode_array", None)) is not None:
            return [encode_array(t) for t in texts]
        return self.encode_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; specials decode to their string, invalid UTF-8 to U+FFFD. An id outside the vocabulary is a
        ValueError naming it, whatever the backend."""
        ids = _token_ids(ids)
        size = self.vocab_size
        if (bad := next((i for i in ids if not 0 <= i < size), None)) is not None:
            raise ValueError(f"id {bad} is outside the tokenizer's vocabulary (ids are 0..{size - 1}); ids from a "
                             "model with a padded vocabulary, or another tokenizer's, do not decode")
        return self._b.decode(ids)  # (an id below vocab_size that no token has decodes to "": a sampler can pick it)

    def token_bytes(self, i: int) -> bytes:
        """The bytes of raw text id ``i`` stands for (part of a UTF-8 character for some byte-level BPE ids; a special
        token's own string)."""
        return self._b.token_bytes(int(i))

    def token_byte_lengths(self, *, first: bool = False) -> list[int]:
        """UTF-8 bytes of raw text that each id stands for; 0 for special tokens (an EOS is not text) and for ids
        no token has (tiktoken's cl100k_base and o200k_base leave some unused). Summed over the targets of an
        evaluation this is the byte count behind val/bpb. For "ab" + "c" + "é" -> [2, 1, 2]. ``first``: as the
        first token of a document, where a SentencePiece-style "▁the" stands for "the" (the space its normalizer
        prepended is no text); the same as elsewhere for the other tokenizers."""
        specials = set(self.special_tokens.values())
        spell = (lambda i: self._b.token_bytes(i, first=True)) if first and self.kind == "hf" else self._b.token_bytes
        return [0 if i in specials else len(spell(i)) for i in range(self.vocab_size)]

    @property
    def kind(self) -> str:
        """Backend name: hf, tiktoken, char or scratch-bpe."""
        return self._b.kind

    @property
    def vocab_size(self) -> int:
        """Number of ids (embedding rows), special tokens included."""
        if self._vocab_size is None:  # (once: scratch-bpe's counts its ids, and decode asks per token while streaming)
            self._vocab_size = self._b.vocab_size
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special-token string -> id."""
        return self._b.special_tokens

    @property
    def eos_id(self) -> int | None:
        """Id of the end-of-text token (the document separator; one of EOS_NAMES), or None when it has none."""
        specials = self.special_tokens
        for name in EOS_NAMES:
            if name in specials:
                return specials[name]
        return None

    @property
    def fingerprint(self) -> str:
        """sha256 hex of the backend state: equal fingerprints encode every text identically. The spec is left
        out, so the same tokenizer loaded from a checkpoint or a folder keeps its fingerprint."""
        if self._fingerprint is None:
            state = self._b.state()
            if self.kind == "tiktoken":  # its name is a rank file's stem: a renamed file is the same tokenizer
                state = {k: v for k, v in state.items() if k != "name"}
            blob = json.dumps({"kind": self.kind, "state": state}, sort_keys=True, ensure_ascii=False)
            self._fingerprint = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        return self._fingerprint

    def state_dict(self) -> dict:
        """Everything needed to rebuild this tokenizer, as str/int/list/dict only (safe for weights_only=True)."""
        return {"version": STATE_VERSION, "kind": self.kind, "spec": self.spec, "state": self._b.state()}

    @classmethod
    def from_state_dict(cls, state: dict) -> Tokenizer:
        """Rebuild a tokenizer from `state_dict()` output."""
        if not isinstance(state, dict) or not isinstance(state.get("state"), dict):  # (an edited file)
            got = type(state).__name__ if not isinstance(state, dict) else f"state {type(state.get('state')).__name__}"
            raise ValueError(f"tokenizer state is not the mapping tinylm writes (version, kind, state), got {got}")
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(f"tokenizer state has version {version!r}; this tinylm reads version {STATE_VERSION}")
        kind = state.get("kind")
        if kind not in BACKENDS:
            raise ValueError(f"tokenizer state has unknown kind {kind!r}; known: {sorted(BACKENDS)}")
        return cls(BACKENDS[kind].from_state(state["state"]), state.get("spec", kind))

    def save(self, directory: str | Path) -> Path:
        """Write `tinylm_tokenizer.json` (and, for HF backends, a standard `tokenizer.json`) into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        from tinylm.paths import writing

        with writing(directory / STATE_FILE):  # (a full disk: the CLI's line names the file)
            (directory / STATE_FILE).write_text(json.dumps(self.state_dict(), ensure_ascii=False), encoding="utf-8")
        if self.kind == "hf":
            with writing(directory / "tokenizer.json"):
                (directory / "tokenizer.json").write_text(self._b.tok.to_str(pretty=True), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a directory written by `save`, a Hugging Face `tokenizer.json`, or a directory holding one.
        Only JSON is read; nothing in the files is executed."""
        path = Path(path)
        if path.is_dir():
            if (path / STATE_FILE).is_file():
                path = path / STATE_FILE
            elif (path / "tokenizer.json").is_file():
                path = path / "tokenizer.json"
            elif (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
                return cls._from_vocab_merges(path)
            else:
                raise FileNotFoundError(f"no tokenizer in directory {path} (expected {STATE_FILE}, tokenizer.json, "
                                        "or vocab.json + merges.txt); pass --data.tokenizer bpe|char|tiktoken:NAME "
                                        "to make one")
        if not path.is_file():
            if path.exists():  # a device or a FIFO: it could be read forever
                raise FileNotFoundError(f"tokenizer file {str(path)!r} is not a regular file; pass --data.tokenizer "
                                        "with the path of a tokenizer file or folder")
            raise FileNotFoundError(f"tokenizer file {path} not found; pass --data.tokenizer with an existing path")
        with _naming(path, "a tokenizer file (tinylm_tokenizer.json, or a Hugging Face tokenizer.json)"):
            data = json.loads(path.read_text(encoding="utf-8"))
            if path.name == STATE_FILE or isinstance(data, dict) and isinstance(data.get("state"), dict):
                return cls.from_state_dict(data)
            if isinstance(data, dict) and all(isinstance(v, int) for v in data.values()):  # GPT-2's has "model": 19849
                if (path.parent / "merges.txt").is_file():
                    raise FormatError(f"this is a vocabulary (token -> id); pass the folder that holds it and "
                                     f"merges.txt, --data.tokenizer {path.parent}")
                raise FormatError("this is a vocabulary (token -> id) without the rest of a tokenizer; with its "
                                 "merges file (GPT-2's), put the two in a folder as vocab.json and merges.txt and pass "
                                 "the folder, or save the tokenizer as one tokenizer.json "
                                 "(AutoTokenizer.from_pretrained(...).save_pretrained(DIR)) and pass that")
            from tokenizers import Tokenizer as HFTokenizer

            return cls(HFBackend(HFTokenizer.from_str(json.dumps(data))), str(path))

    @classmethod
    def _from_vocab_merges(cls, folder: Path) -> Tokenizer:
        """A folder of GPT-2's vocab.json + merges.txt (a Hugging Face GPT-2 download, or `ByteLevelBPE.save`),
        encoded by tiktoken with the same ranks (the ids of the merges, in order)."""
        from tinylm.tokenize.bpe import FORMAT, ByteLevelBPE

        with _naming(folder / "vocab.json", "a GPT-2 vocab.json (with merges.txt beside it)"):
            config = folder / "config.json"  # ByteLevelBPE.save's (pattern, specials); a model's config.json is not
            header = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else None
            if isinstance(header, dict) and header.get("format") == FORMAT:
                bpe = ByteLevelBPE.load(folder)
            else:
                bpe = ByteLevelBPE.from_vocab_merges(folder / "vocab.json", folder / "merges.txt")
                _merged_as_gpt2s(bpe)
            return cls(TiktokenBackend("vocab-merges", bpe.pattern, ranks_to_text(bpe.ranks), dict(bpe.special_tokens)),
                       str(folder))

    def __repr__(self) -> str:
        return f"Tokenizer(spec={self.spec!r}, kind={self.kind!r}, vocab_size={self.vocab_size})"


def _merged_as_gpt2s(bpe: Any) -> None:
    """Refuse GPT-2 files that tiktoken's ranks would encode otherwise than GPT-2's BPE (the pair listed first):
    a token whose own bytes the merges do not make into it (see `unmerged_token`)."""
    from tokenizers import models

    from tinylm.tokenize.backends import FormatError, unmerged_token
    from tinylm.tokenize.bpe import _to_unicode

    vocab = {_to_unicode(t): i for t, i in bpe.ranks.items()}
    merges = [(_to_unicode(a), _to_unicode(b)) for a, b in bpe.merges]
    tokens = [a + b for a, b in merges]
    if (token := unmerged_token(tokens, [vocab[t] for t in tokens], models.BPE(vocab, merges))) is not None:
        raise FormatError(f"its merges make {token!r}, but in their order {token!r} itself is encoded as other "
                          "tokens, which tiktoken's ranks would not copy; save the files as one tokenizer.json "
                          "(tokenizers: Tokenizer(models.BPE.from_file(...)) with a ByteLevel pre-tokenizer) and "
                          "pass that")


@contextlib.contextmanager
def _naming(path: Path, expected: str) -> Iterator[None]:
    """Turn any failure to read `path` as `expected` (bad JSON, binary bytes, missing fields, a library's own
    parse error) into one ValueError naming the file and the kinds of tokenizer tinylm reads."""
    try:
        yield
    except PermissionError:
        raise  # a file that cannot be read is not a file of another kind: the CLI names the path and the fix
    except Exception as e:
        reason = (str(e).strip().splitlines() or [""])[0]
        # tinylm's own reason whole; a library's (which can be a page long) cut, and named by its type
        reason = reason if isinstance(e, FormatError) else f"{type(e).__name__}: {reason[:200]}"
        raise ValueError(f"{path} is not {expected} ({reason}); --data.tokenizer takes "
                         f"{VALID_SPECS}") from e


# ---------------------------------------------------------------------------------------------------- builders
TIKTOKEN_SIZES = {  # name: (vocab_size, id of <|endoftext|>), as tiktoken's registry (tiktoken_ext.openai_public)
    "gpt2": (50257, 50256), "r50k_base": (50257, 50256), "p50k_base": (50281, 50256), "p50k_edit": (50284, 50256),
    "cl100k_base": (100277, 100257), "o200k_base": (200019, 199999),
}
"""The sizes of tiktoken's encodings, known without their rank files (downloaded on first use): what `tinylm plan`
needs of a tokenizer, offline too."""


def known_sizes(spec: str) -> tuple[int, int | None] | None:
    """(vocab_size, eos_id) of tokenizer ``spec`` when they are known without loading it (``tiktoken:NAME`` of
    tiktoken's own encodings), else None."""
    return TIKTOKEN_SIZES.get(spec.removeprefix("tiktoken:")) if spec.startswith("tiktoken:") else None


def build_tokenizer(spec: str, *, vocab_size: int = 8192,
                    documents: Callable[[], Iterable[str]] | None = None) -> Tokenizer:
    """Make the tokenizer named by `spec` (see the module docstring).

    Args:
        spec: which tokenizer; trained kinds (bpe, scratch-bpe, char) learn from `documents`.
        vocab_size: target vocabulary size of trained BPE tokenizers, special tokens included; the result may be
            smaller when the corpus runs out of pairs to merge. Ignored by the other kinds.
        documents: a callable returning a fresh iterable of document strings (called once per pass); only the
            trained kinds need it.
    """
    if not spec.strip():  # Path("") is the working folder: its tokenizer.json would be taken without a word
        raise ValueError(f"--data.tokenizer is empty ({spec!r}: an unset shell variable?); pass one of: {VALID_SPECS}")
    if spec in TRAINED_SPECS:
        if documents is None:
            raise ValueError(f"tokenizer {spec!r} is trained on the corpus, so build_tokenizer needs documents=")
        if not callable(documents):  # (a list is read once per pass: the callable gives a fresh one each time)
            raise TypeError(f"build_tokenizer's documents= is a function returning the documents, got a "
                            f"{type(documents).__name__}: pass documents=lambda: texts")
        if spec == "char":
            return _train_char(documents())
        if vocab_size < 256 + 1:
            raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs the 256 byte "
                             f"tokens plus 1 special token ({EOT}); use --data.vocab_size 257 or more "
                             "(8192 is a good start)")
        return _train_bpe(documents(), vocab_size) if spec == "bpe" else _train_scratch(documents(), vocab_size)
    if spec.startswith("tiktoken:"):
        return _load_tiktoken(spec)
    if spec.endswith(".tiktoken") and Path(spec).is_file():  # a rank file as a path alone: it says what it is
        return _load_tiktoken(f"tiktoken:{spec}")
    if Path(spec).exists():
        tok = Tokenizer.load(spec)
        tok.spec = spec
        _warn_lossy(tok)
        return tok
    if any(c in spec for c in "/\\") or spec.endswith((".json", ".tiktoken")):
        raise FileNotFoundError(f"tokenizer path {spec!r} not found; pass an existing path or one of: {VALID_SPECS}")
    raise ValueError(f"unknown tokenizer {spec!r}; valid specs: {VALID_SPECS}")


_ROUND_TRIP = "Once upon a time, there was a cat.\nIt sat on the mat, and it purred."


def _warn_lossy(tok: Tokenizer) -> None:
    """A tokenizer.json that does not decode its ids to the text it encoded (a Whitespace pre-tokenizer without a
    decoder joins words with spaces; an unknown token loses characters) trains the model on other text than the
    corpus, and generate writes that text: said once, when it is loaded by path."""
    if tok.kind != "hf":
        return
    try:
        back = tok.decode(tok.encode(_ROUND_TRIP))
    except ValueError:  # characters it has no id for and no unknown token: its own error says so when it encodes
        return
    if tok._b._byte_level and back == _ROUND_TRIP:  # (English reads back through a vocabulary of English bytes)
        from tinylm.tokenize.bpe import bytes_to_unicode

        vocab, spelled = tok._b.tok.get_vocab(), bytes_to_unicode()
        if lacking := bytes(b for b in range(256) if spelled[b] not in vocab):
            warnings.warn(f"tokenizer {tok.spec} is byte-level but lacks {len(lacking)} of the 256 byte tokens (e.g. "
                          f"{lacking[:4]!r}): text holding those bytes loses them, silently (the library drops what "
                          "it has no token for); use --data.tokenizer bpe, or a tokenizer.json trained with "
                          "initial_alphabet=pre_tokenizers.ByteLevel.alphabet()")
    if back != _ROUND_TRIP:
        i = next((i for i, (a, b) in enumerate(zip(_ROUND_TRIP, back)) if a != b), min(len(back), len(_ROUND_TRIP)))
        start = max(0, i - 10)
        warnings.warn(f"tokenizer {tok.spec} does not give back the text it encodes "
                      f"({_ROUND_TRIP[start:i + 15]!r} decodes as {back[start:i + 15]!r}): the model would learn "
                      "and write text other than the corpus's (a pre-tokenizer without a decoder, or an unknown "
                      "token); use --data.tokenizer bpe, or a tokenizer.json that decodes its own ids to the text")


def _train_bpe(docs: Iterable[str], vocab_size: int, max_piece_chars: int | None = TRAIN_PIECE_CHARS) -> Tokenizer:
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer(models.BPE())
    encoding_split = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 regex + byte->unicode map
    if max_piece_chars is not None:  # train on GPT-2's pieces cut into chunks (see TRAIN_PIECE_CHARS)
        # One regex whose runs stop at max_piece_chars (` ?\p{L}+` -> ` ?\p{L}{1,64}`): the same pieces as GPT-2's
        # for every run shorter than that, at the cost of one regex pass (a second Split cost 40% more CPU)
        capped = GPT2_PATTERN.replace("+", f"{{1,{max_piece_chars}}}")
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(capped), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = encoding_split
    tok.decoder = decoders.ByteLevel()
    import sys

    from tinylm.progress import disabled_by_env, is_terminal

    # the library's own bars (counting pairs, merges) write to standard output: on a terminal only (in a log, or
    # `tinylm prepare > out.txt`, they were blank lines), and not under TQDM_DISABLE
    shown = is_terminal(sys.stdout) and not disabled_by_env()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=shown,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # all 256 bytes
    from tinylm.tokenize.bpe import _valid_utf8

    # a lone surrogate as U+FFFD, as encode reads it (the library's trainer raised UnicodeEncodeError on one)
    _while_signals_work(tok.train_from_iterator, map(_valid_utf8, docs), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:  # as scratch-bpe says it
        warnings.warn(f"training text ran out of pairs to merge after {tok.get_vocab_size() - 257} merges; vocab_size "
                      f"is {tok.get_vocab_size()} instead of {vocab_size} (give more text for a larger one)")
    tok.pre_tokenizer = encoding_split  # encoding does not chunk: the saved tokenizer is plain GPT-2 style
    return Tokenizer(HFBackend(tok), "bpe")


STOP_WAIT_S = 10.0
"""How long a stopped command waits for the BPE trainer's thread to come back out of the library (see
`_while_signals_work`)."""


def _while_signals_work(fn: Callable[..., Any], docs: Iterable[str], **kwargs: Any) -> Any:
    """``fn(docs, **kwargs)`` (a library's call into Rust that runs for long, reading ``docs``) in a thread of its
    own, the main thread waiting in Python: Python runs a signal's handler there alone, between its own steps, and a
    Ctrl+C or SIGTERM during BPE training (1 s per MB) waited for the training's end (10 s on 10 MB).

    A stop meanwhile (a signal's, any error) ends the library's reading of ``docs`` (its next read raises) and waits
    up to STOP_WAIT_S for the thread to come back out of it: left reading, the thread called back into Python as the
    interpreter exited, and the process aborted ("FATAL: exception not rethrown", exit 134, in place of the stop's
    143 or 130 and its line's). A thread past its reading (counting pairs, merging: Rust alone) is left to the
    process's end, as before."""
    import threading

    done: dict[str, Any] = {}
    over = threading.Event()  # (not Thread.join: a Ctrl+C inside it marks a running thread stopped, Python 3.11)
    stopped: list[bool] = []  # (read by the thread at each document: a list, no lock)
    reading = [True]  # the library still reads docs, calling back into Python

    def read() -> Iterator[str]:
        for doc in docs:
            if stopped:
                raise InterruptedError("the command stopped")  # (the thread's error, never raised in the main one)
            yield doc
        reading.clear()

    def run() -> None:
        try:
            done["value"] = fn(read(), **kwargs)
        except BaseException as e:  # noqa: BLE001 (raised in the main thread)
            done["error"] = e
        finally:
            over.set()

    threading.Thread(target=run, daemon=True, name="tinylm-tokenizer-training").start()
    try:
        while not over.wait(0.1):
            pass
    except BaseException:
        stopped.append(True)
        if reading:
            over.wait(STOP_WAIT_S)
        raise
    if "error" in done:
        raise done["error"]
    return done["value"]


def _train_scratch(docs: Iterable[str], vocab_size: int) -> Tokenizer:
    from tinylm.tokenize.bpe import (
        ByteLevelBPE,  # lazily: the char/bpe paths must not depend on it
    )

    bpe = ByteLevelBPE.train(docs, vocab_size=vocab_size, special_tokens=[EOT])
    return Tokenizer(ScratchBackend(bpe), "scratch-bpe")


def _train_char(docs: Iterable[str]) -> Tokenizer:
    from tinylm.tokenize.bpe import _valid_utf8

    chars: set[str] = set()
    n_docs = 0
    for doc in docs:
        chars.update(_valid_utf8(doc))  # a lone surrogate as U+FFFD, as encode reads it (no UTF-8 file holds one)
        n_docs += 1
    if not chars:
        raise ValueError("cannot build a char tokenizer from an empty corpus; pass --data.corpus PATH to text")
    if len(chars) == 1 and n_docs == 1:  # one id: every next token is known (loss 0 from the first step)
        raise ValueError(f"the corpus holds a single distinct character ({next(iter(chars))!r}): a model of it has "
                         "nothing to learn; pass --data.corpus PATH to text")
    ordered = "".join(sorted(chars))
    # the separator is needed only when there is something to separate (65 ids for tinyshakespeare, like nanoGPT)
    specials = {EOT: len(ordered)} if n_docs > 1 else {}
    return Tokenizer(CharBackend(ordered, specials), "char")


def _load_tiktoken(spec: str) -> Tokenizer:
    import tiktoken

    target = spec.split(":", 1)[1]
    if not target:
        raise ValueError(f"tokenizer {spec!r} names no encoding; use tiktoken:gpt2 or tiktoken:PATH.tiktoken")
    named = target in tiktoken.list_encoding_names()  # a file or folder "gpt2" beside the command is not
    # tiktoken:gpt2 (the file is tiktoken:./gpt2)
    if not named and (Path(target).exists() and not Path(target).is_dir() or target.endswith(".tiktoken")):
        path = Path(target)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "not found"
            raise FileNotFoundError(f"tiktoken rank file {target!r} {what}; pass tiktoken:PATH to an existing "
                                    "`.tiktoken` file")
        with _naming(path, "a .tiktoken rank file (lines of 'base64token rank')"):
            parsed = parse_ranks(path.read_text(encoding="utf-8"))
            ranks_text, ranks = ranks_to_text(parsed), list(parsed.values())
            if len(ranks) < 256:
                raise FormatError(f"it has {len(ranks)} ranks; a byte-level BPE has at least the 256 single bytes")
            if lacking := bytes(b for b in range(256) if bytes([b]) not in parsed):  # (text holding one: a Rust panic)
                raise FormatError(f"it lacks {len(lacking)} of the 256 single bytes ({lacking[:8]!r}) that a "
                                  "byte-level BPE has, so text holding them could not be encoded")
            # after the highest rank: a file whose ranks have gaps would otherwise give EOS the id of a real token
            return Tokenizer(TiktokenBackend(path.stem, GPT2_PATTERN, ranks_text, {EOT: max(ranks) + 1}), spec)
    if not named:
        raise ValueError(f"unknown tiktoken encoding {target!r}; known: {tiktoken.list_encoding_names()}, "
                         "or pass tiktoken:PATH to a local .tiktoken rank file")
    try:
        enc = tiktoken.get_encoding(target)
    except Exception as e:  # requests/blobfile errors of every kind: all mean "not cached and not reachable"
        raise UnavailableError(
            f"tiktoken encoding {target!r} could not be loaded ({type(e).__name__}: {e}); it is downloaded on first "
            "use and there is no network or no cached copy (TIKTOKEN_CACHE_DIR). Pass tiktoken:PATH to a local "
            ".tiktoken rank file instead") from e
    # tiktoken keeps no public accessor for its ranks; these attributes have been stable since 0.3
    ranks_text = ranks_to_text(enc._mergeable_ranks)
    return Tokenizer(TiktokenBackend(enc.name, enc._pat_str, ranks_text, dict(enc._special_tokens)), spec)
