"""Which constrained-decoding engine for tinylm: llguidance, xgrammar and outlines-core side by side on CPU.

For each engine and vocabulary (tinylm's char vocabulary of tinyshakespeare, GPT-2's 50,257-id byte-level BPE) it
compiles a regex and a JSON schema, then walks 200 steps of decoding: compute the mask of allowed tokens, pick a
random allowed token (a stand-in for the model's choice), advance. Reported: compile time, and the mean time per
token of mask + advance (the overhead constrained decoding adds to every step). It also checks what each engine
makes of a token that is half of a UTF-8 character (byte-level BPE has them) and of a char vocabulary.

    nice -n 10 python benchmarks/bench_grammar_engines.py --gpt2 PATH/gpt2.tiktoken
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time

import numpy as np
import torch

REGEX = r"(ROMEO|JULIET): [A-Z][a-z]{2,12}( [a-z]{2,12}){2,8}\."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def vocabularies(gpt2_path: str | None) -> dict[str, tuple[list[bytes], int, object]]:
    """{name: (bytes of each id, eos id, encode)}: tinylm's char tokenizer of the test fixture (plus an EOS) and
    GPT-2's tokenizer through tinylm's tiktoken backend."""
    from pathlib import Path

    from tinylm.tokenize import build_tokenizer

    text = (Path(__file__).resolve().parents[1] / "tests/fixtures/tinyshakespeare_100k.txt").read_text()
    out = {}
    char = build_tokenizer("char", documents=lambda: [text])
    specs = [("char", char)] + ([("gpt2 BPE", build_tokenizer(f"tiktoken:{gpt2_path}"))] if gpt2_path else [])
    for name, tok in specs:
        tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
        eos = tok.eos_id
        if eos is None:  # tinyshakespeare's char vocabulary has none: one more id stands for it
            tokens, eos = tokens + [b"<|endoftext|>"], len(tokens)
        out[f"{name} ({len(tokens)})"] = (tokens, eos, lambda s, tok=tok: tok.encode(s))
    return out


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokens: list[bytes], eos: int, encode) -> None:
        import llguidance

        class Vocab:  # what llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id, special_token_ids = eos, None, [eos]

            def __init__(self):
                self.tokens = tokens

            def __call__(self, s):  # tokenizes text the grammar forces (bytes: llguidance tries b"test" first)
                if isinstance(s, bytes):
                    s = s.decode("utf-8", errors="replace")
                try:
                    return encode(s)
                except ValueError:  # a character the char vocabulary lacks
                    return []

        self.ll, self.V = llguidance, len(tokens)
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocab()))

    def compile(self, kind: str, spec):
        m = self.ll.LLMatcher
        grammar = m.grammar_from_regex(spec) if kind == "regex" else m.grammar_from_json_schema(spec)
        matcher = m(self.tok, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def mask(self, matcher) -> np.ndarray:
        return np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)

    def advance(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_stopped()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokens: list[bytes], eos: int, encode) -> None:
        import xgrammar as xgr

        self.xgr, self.V = xgr, len(tokens)
        info = xgr.TokenizerInfo(tokens, vocab_type=xgr.VocabType.RAW, vocab_size=len(tokens), stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info)
        self.bitmask = xgr.allocate_token_bitmask(1, self.V)

    def compile(self, kind: str, spec):
        c = self.compiler
        compiled = c.compile_regex(spec) if kind == "regex" else c.compile_json_schema(json.dumps(spec))
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher) -> np.ndarray:
        matcher.fill_next_token_bitmask(self.bitmask)
        return self.bitmask.numpy().view(np.uint8)[0]

    def advance(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokens: list[bytes], eos: int, encode) -> None:
        import outlines_core

        self.oc, self.V = outlines_core, len(tokens)
        vocab: dict[bytes, list[int]] = {}
        for i, t in enumerate(tokens):
            if i != eos:
                vocab.setdefault(t, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, vocab)

    def compile(self, kind: str, spec):
        regex = spec if kind == "regex" else self.oc.json_schema.build_regex_from_schema(json.dumps(spec))
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def mask(self, guide) -> list[int]:
        return guide.get_tokens()

    def advance(self, guide, token: int) -> bool:
        guide.advance(token)
        return True

    def done(self, guide) -> bool:
        return guide.is_finished()


def walk(engine, matcher, eos: int, steps: int, rng: random.Random) -> tuple[int, float, list[int]]:
    """(tokens, seconds, ids): random allowed tokens until the grammar ends or `steps`."""
    ids: list[int] = []
    spent = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        mask = engine.mask(matcher)
        spent += time.perf_counter() - start
        if isinstance(mask, list):  # outlines-core: the allowed ids
            allowed = mask
        else:  # a bitmask, one bit per id
            allowed = np.unpackbits(mask, bitorder="little")[: engine.V].nonzero()[0].tolist()
        choices = [t for t in allowed if t != eos] or allowed  # stand-in model: prefers text while it may go on
        token = rng.choice(choices)
        start = time.perf_counter()
        ok = engine.advance(matcher, token)
        spent += time.perf_counter() - start
        assert ok, f"{engine.name} refused a token it allowed"
        ids.append(token)
        if token == eos or engine.done(matcher):
            break
    return len(ids), spent, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt2", help="gpt2.tiktoken (base64 token + rank lines)")
    ap.add_argument("--walks", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; regex {REGEX!r}; schema {json.dumps(SCHEMA)}")
    for vname, (tokens, eos, encode) in vocabularies(args.gpt2).items():
        for cls in (LLGuidance, XGrammar, OutlinesCore):
            try:
                t0 = time.perf_counter()
                engine = cls(tokens, eos, encode)
                setup = time.perf_counter() - t0
            except ImportError:
                print(f"{vname:28s} {cls.name:14s} not installed (pip install {cls.name})")
                continue
            except Exception as e:  # an engine that cannot take this vocabulary at all
                print(f"{vname:28s} {cls.name:14s} vocabulary refused: {type(e).__name__}: {str(e)[:100]}")
                continue
            for kind, spec in (("regex", REGEX), ("json", SCHEMA)):
                try:
                    t0 = time.perf_counter()
                    matcher = engine.compile(kind, spec)
                    compile_s = time.perf_counter() - t0
                    rng, n, secs, texts = random.Random(0), 0, 0.0, []
                    for _ in range(args.walks):
                        m = engine.compile(kind, spec) if n else matcher
                        k, s, ids = walk(engine, m, eos, 200, rng)
                        n, secs = n + k, secs + s
                        texts.append(b"".join(tokens[i] for i in ids if i != eos).decode("utf-8", "replace"))
                    ok = all(re.fullmatch(REGEX, t) for t in texts) if kind == "regex" else \
                        all(isinstance(json.loads(t), dict) for t in texts)
                    print(f"{vname:28s} {cls.name:14s} {kind:5s} setup {setup:5.2f} s  "
                          f"compile {compile_s * 1e3:7.1f} ms"
                          f"  {secs / n * 1e6:8.1f} us/token  ({n} tokens; all match: {ok})  e.g. {texts[0][:50]!r}")
                except Exception as e:
                    print(f"{vname:28s} {cls.name:14s} {kind:5s} failed: {type(e).__name__}: {str(e)[:120]}")


if __name__ == "__main__":
    main()
