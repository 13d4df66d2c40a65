"""Encoding speed of a trained `bpe` tokenizer: `tokenizers`' own encode_batch_fast against the tiktoken twin that
`tinylm prepare` encodes with (`tinylm.tokenize.backends.tiktoken_twin`), and tiktoken's GPT-2 for scale.

Each encoder takes the `<|endoftext|>`-separated documents of the corpus in 8 M-character batches, as the dataset
writer hands them over, and turns the ids into uint16 arrays; the ids of the two `bpe` encoders are compared whole.
CPU time is the process's (user + system, all threads), so a loaded machine inflates the wall time only.

    python benchmarks/bench_prepare.py --make-corpus /tmp/corpus30.txt --mb 30   # once, or any text file
    python benchmarks/bench_bpe_encode.py --corpus /tmp/corpus30.txt --rounds 2
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np

from tinylm.tokenize import build_tokenizer
from tinylm.tokenize.backends import encode_in_threads, tiktoken_twin
from tinylm.tokenize.patterns import EOT, GPT2_PATTERN


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--train-chars", type=int, default=10_000_000, help="the tokenizer learns from this head")
    ap.add_argument("--ranks", type=Path,
                    default=Path(__file__).resolve().parents[2] / "shared" / "data" / "gpt2.tiktoken")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    text = args.corpus.read_text(encoding="utf-8")
    docs = [d.strip() for d in text.split(EOT) if d.strip()]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    batches, batch, size = [], [], 0
    for d in docs:
        batch.append(d)
        size += len(d)
        if size >= 8 << 20:
            batches.append(batch)
            batch, size = [], 0
    batches.append(batch)
    c0, t0 = _cpu(), time.perf_counter()
    tok = build_tokenizer("bpe", vocab_size=args.vocab_size, documents=lambda: [text[:args.train_chars]])._b.tok
    print(f"trained bpe {args.vocab_size} on {args.train_chars / 1e6:.0f} M characters: cpu {_cpu() - c0:.1f} s, "
          f"wall {time.perf_counter() - t0:.1f} s")
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    twin = tiktoken_twin(tok)
    gpt2 = tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=load_tiktoken_bpe(str(args.ranks)),
                             special_tokens={})
    encoders = {
        "tokenizers encode_batch_fast": lambda b: [e.ids for e in tok.encode_batch_fast(b, add_special_tokens=False)],
        "tiktoken twin (tinylm)": lambda b: encode_in_threads(twin, b),
        "tiktoken gpt2 (50,257 ids)": lambda b: encode_in_threads(gpt2, b),
    }
    cpu: dict[str, list[float]] = {name: [] for name in encoders}
    ids = {}
    for r in range(args.rounds):
        for name in encoders if r % 2 == 0 else reversed(encoders):
            c0, t0 = _cpu(), time.perf_counter()
            out = [np.asarray(i, dtype=np.uint16) for b in batches for i in encoders[name](b)]
            cpu[name].append(_cpu() - c0)
            wall = time.perf_counter() - t0
            print(f"round {r} {name:28s} cpu {cpu[name][-1]:6.2f} s  wall {wall:6.2f} s", flush=True)
            if "gpt2" not in name:
                ids[name] = np.concatenate(out)
    same = all(np.array_equal(a, b) for a, b in zip(ids.values(), list(ids.values())[1:]))
    print(f"\ncorpus {args.corpus} ({mb:.1f} MB, {len(docs):,} documents); bpe ids identical: {same}")
    print("| encoder | CPU s (mean) | MB per CPU-s | CPU vs tokenizers |\n|---|---:|---:|---:|")
    base = sum(cpu["tokenizers encode_batch_fast"]) / args.rounds
    for name, cs in cpu.items():
        c = sum(cs) / len(cs)
        print(f"| {name} | {c:.2f} | {mb / c:.2f} | {c / base:.2f}x |")


if __name__ == "__main__":
    main()
