"""`tinylm prepare` with the `char` and `tiktoken` kinds against what nanoGPT's own prepare scripts do on the same text.

bench_prepare.py measures the trained `bpe` kind against bare `tokenizers`; this one the two kinds that train
nothing (or only a character set):

- char: `tinylm prepare --data.tokenizer char` against nanoGPT's `data/shakespeare_char/prepare.py` (its logic on
  the corpus file: read whole, `[stoi[c] for c in data]` 90/10, `np.array(..., uint16).tofile`).
- tiktoken: `tinylm prepare --data.tokenizer tiktoken:GPT2.tiktoken` against nanoGPT's openwebtext `prepare.py`
  encoding (`enc.encode_ordinary(doc) + [eot]` per `<|endoftext|>`-separated document, uint16 written as it goes;
  one process), with the same local rank file.

Each side runs in its own subprocess (peak RSS is its own), sides alternate, and the table gives CPU time (user +
system of the child), wall time, peak RSS and MB/s, and the ratios tinylm / nanoGPT.

    python benchmarks/bench_prepare.py --make-corpus /tmp/corpus100.txt --mb 100   # once, or any text file
    python benchmarks/bench_prepare_kinds.py --corpus /tmp/corpus100.txt --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prepare import DOCS, _measure  # noqa: E402

NANOGPT_CHAR = r'''
import sys, numpy as np
path, out = sys.argv[1], sys.argv[2]
data = open(path, encoding="utf-8").read()
stoi = {c: i for i, c in enumerate(sorted(set(data)))}
n = len(data)
np.array([stoi[c] for c in data[:int(n * 0.9)]], dtype=np.uint16).tofile(out + "/train.bin")
np.array([stoi[c] for c in data[int(n * 0.9):]], dtype=np.uint16).tofile(out + "/val.bin")
'''

NANOGPT_TIKTOKEN = r'''
import sys, numpy as np, tiktoken
from tiktoken.load import load_tiktoken_bpe
path, out, ranks = sys.argv[1], sys.argv[2], sys.argv[3]
EOT = "<|endoftext|>"
pat = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ranks = load_tiktoken_bpe(ranks)
enc = tiktoken.Encoding("gpt2", pat_str=pat, mergeable_ranks=ranks, special_tokens={EOT: len(ranks)})
''' + DOCS + r'''
with open(out + "/all.bin", "wb") as f:
    for d in docs():
        ids = enc.encode_ordinary(d)
        ids.append(enc.eot_token)
        f.write(np.array(ids, dtype=np.uint16).tobytes())
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a text file (bench_prepare.py --make-corpus makes one)")
    ap.add_argument("--ranks", type=Path,
                    default=Path(__file__).resolve().parents[2] / "shared" / "data" / "gpt2.tiktoken")
    ap.add_argument("--kinds", nargs="*", default=["char", "tiktoken"])
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (tinylm, nanogpt, nanogpt, tinylm ...)")
    args = ap.parse_args()
    tinylm = [str(Path(sys.executable).with_name("tinylm"))]
    size_mb = args.corpus.stat().st_size / 1e6
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_prepare_kinds-") as tmp:
        for kind in args.kinds:
            spec = "char" if kind == "char" else f"tiktoken:{args.ranks}"
            for r in range(args.rounds):
                for side in ("tinylm", "nanogpt") if r % 2 == 0 else ("nanogpt", "tinylm"):
                    out = Path(tmp) / f"{kind}-{side}-{r}"
                    out.mkdir()
                    if side == "tinylm":
                        cmd = [*tinylm, "prepare", "--data.corpus", str(args.corpus), "--data.tokenizer", spec,
                               "--data.cache_dir", str(out)]
                    else:
                        script = NANOGPT_CHAR if kind == "char" else NANOGPT_TIKTOKEN
                        cmd = [sys.executable, "-c", script, str(args.corpus), str(out), str(args.ranks)]
                    m = _measure(cmd, {**os.environ, "TQDM_DISABLE": "1"})
                    m.update(kind=kind, side=side)
                    rows.append(m)
                    print(f"{kind:8s} round {r} {side:7s}  cpu {m['cpu']:6.1f} s  wall {m['wall']:6.1f} s  "
                          f"rss {m['rss_mb']:6.0f} MB", flush=True)
                    shutil.rmtree(out, ignore_errors=True)
    print(f"\ncorpus {args.corpus} ({size_mb:.1f} MB), {os.cpu_count()} cores, {args.rounds} round(s)")
    print("| kind | side | CPU s | wall s | peak RSS MB | MB/s (wall) |\n|---|---|---:|---:|---:|---:|")
    summary = {}
    for kind in args.kinds:
        agg = {}
        for side in ("tinylm", "nanogpt"):
            ms = [m for m in rows if m["kind"] == kind and m["side"] == side]
            agg[side] = a = {k: sum(m[k] for m in ms) / len(ms) for k in ("cpu", "wall", "rss_mb")}
            print(f"| {kind} | {side} | {a['cpu']:.1f} | {a['wall']:.1f} | {a['rss_mb']:.0f} | "
                  f"{size_mb / a['wall']:.2f} |")
        ratio = {k: agg["tinylm"][k] / agg["nanogpt"][k] for k in ("cpu", "wall", "rss_mb")}
        print(f"| {kind} | tinylm / nanogpt | {ratio['cpu']:.2f}x | {ratio['wall']:.2f}x | {ratio['rss_mb']:.2f}x | |")
        summary[kind] = {"agg": agg, "ratio": ratio}
    print(json.dumps({"corpus_mb": size_mb, **summary}))


if __name__ == "__main__":
    main()
