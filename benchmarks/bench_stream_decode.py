"""The text side of `tinylm generate` on long outputs: the streamed text and the stop-string checks, as tinylm does
them now (each token's text decoded after a few tokens before it: `decode_after`) vs the way they were done before
(the whole continuation decoded again at every token), side by side in one process, no model involved.

The tokens are GPT-2's byte-level BPE ids of tinyshakespeare (or a local .tiktoken file), fed one at a time to
tinylm's `_StreamPrinter` (output to a null stream) and to the stop-string check of `_Rows` with a stop string
that never occurs; the baseline decodes all ids so far at every token, as both did before. Both sides must print
the same text. Prints CPU seconds and the ratio for each length.

    python benchmarks/bench_stream_decode.py --data ../shared/data
    python benchmarks/bench_stream_decode.py --data ../shared/data --lengths 1000 4000
"""

from __future__ import annotations

import argparse
import io
import platform
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

from tinylm.cli import commands
from tinylm.generate import SamplingConfig
from tinylm.generate.strategies import _Rows
from tinylm.tokenize import build_tokenizer


def cpu(fn, *args) -> tuple[float, object]:
    start = time.process_time()
    out = fn(*args)
    return time.process_time() - start, out


def stream_tinylm(decode, prompt: list[int], ids: list[int]) -> str:
    sink = io.StringIO()
    with redirect_stdout(sink):
        printer = commands._StreamPrinter(decode, prompt, "")  # (no prompt text: the continuation alone)
        for t in ids:
            printer(0, t)
        printer.finish(ids)
    return sink.getvalue()


def stream_before(decode, ids: list[int]) -> str:
    """The printer as it was: the whole continuation decoded at every token, what is new printed."""
    sink, shown, done = io.StringIO(), 0, []
    for t in ids:
        done.append(t)
        text = decode(done)
        if not text.endswith("\ufffd"):
            sink.write(text[shown:])
            shown = len(text)
    return sink.getvalue()


def stops_tinylm(decode, prompt: list[int], ids: list[int]) -> bool:
    rows = _Rows(SamplingConfig(stop_strings=["\x00never"]), decode, None, [prompt])
    for t in ids:
        rows.accept([t])
    return rows.active[0]


def stops_before(decode, ids: list[int], stop: str = "\x00never") -> bool:
    return not any(stop in decode(ids[: i + 1]) for i in range(len(ids)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 4000, 16000])
    args = ap.parse_args()
    tok = build_tokenizer(f"tiktoken:{args.data / 'gpt2.tiktoken'}")
    text = (args.data / "tinyshakespeare.txt").read_text(encoding="utf-8")
    all_ids = tok.encode(text[:400_000])
    prompt, rest = all_ids[:8], all_ids[8:]
    print(f"{platform.processor() or platform.machine()}, Python {sys.version.split()[0]}, GPT-2 BPE (tiktoken)\n")
    print("| new tokens | stream: before (s) | stream: tinylm (s) | ratio | "
          "stop check: before (s) | tinylm (s) | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.lengths:
        ids = rest[:n]
        t_before, before = cpu(stream_before, tok.decode, ids)
        t_now, now = cpu(stream_tinylm, tok.decode, prompt, ids)
        assert now == before == tok.decode(ids), "the streamed texts differ"
        s_before, active_before = cpu(stops_before, tok.decode, ids)
        s_now, active_now = cpu(stops_tinylm, tok.decode, prompt, ids)
        assert active_before and active_now
        print(f"| {n:,} | {t_before:.3f} | {t_now:.3f} | **{t_now / t_before:.3f}** | {s_before:.3f} | {s_now:.3f} "
              f"| **{s_now / s_before:.3f}** |")


if __name__ == "__main__":
    main()
