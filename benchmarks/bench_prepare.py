"""`tinylm prepare` vs the bare Hugging Face `tokenizers` library doing the same work, side by side.

Both sides train the same byte-level BPE (GPT-2 pre-tokenizer, `<|endoftext|>` special, all 256 bytes) on the same
`<|endoftext|>`-separated documents with `train_from_iterator`, encode every document with `encode_batch`, and write
uint16 ids. Each side runs in its own subprocess (so peak RSS is its own), the sides alternate, and the table gives
CPU time (user + system of the child), wall time, peak RSS and the ratios tinylm / bare.

    python benchmarks/bench_prepare.py --make-corpus /tmp/corpus100.txt --mb 100   # once: a generated corpus
    python benchmarks/bench_prepare.py --corpus /tmp/corpus100.txt --rounds 2

The corpus is generated from ../shared/data (TinyStories sample, tinyshakespeare, corpus.en, german.txt): real
lines shuffled together with sentences of Zipf-distributed words, a share of them new words spelled by a character
trigram model of the sources, so the vocabulary is large and BPE training is not trivial.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EOT = "<|endoftext|>"
SOURCES = ("tinystories_sample.txt", "tinyshakespeare.txt", "corpus.en", "german.txt")

# The documents of a corpus file separated by <|endoftext|>, read in 1 MB chunks (the baselines' own reader; they
# define `path` and `EOT` before it).
DOCS = r'''
def docs():
    rest = ""
    with open(path, encoding="utf-8") as f:
        while chunk := f.read(1 << 20):
            parts = (rest + chunk).split(EOT)
            rest = parts.pop()
            yield from (p.strip() for p in parts if p.strip())
    if rest.strip():
        yield rest.strip()
'''

# The bare library's side: the code a user of `tokenizers` would write for the same job.
BARE = r'''
import sys, numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
path, out, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
EOT = "<|endoftext|>"
''' + DOCS + r'''

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(docs(), trainer=trainer)
eos = tok.token_to_id(EOT)
batch, n = [], 0
with open(out, "wb") as f:
    def flush():
        ids = []
        for e in tok.encode_batch_fast(batch, add_special_tokens=False):
            ids.extend(e.ids); ids.append(eos)
        f.write(np.asarray(ids, dtype=np.uint16).tobytes())
        return len(ids)
    size = 0
    for d in docs():
        batch.append(d); size += len(d)
        if size >= 8 << 20:
            n += flush(); batch, size = [], 0
    n += flush()
print(n)
'''


def make_corpus(out: Path, mb: float, data: Path, seed: int = 0) -> None:
    """Write about `mb` MB of varied `<|endoftext|>`-separated documents to `out`."""
    import random

    import numpy as np

    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    text = {name: (data / name).read_text(encoding="utf-8") for name in SOURCES}
    lines = [ln.strip() for t in text.values() for ln in t.replace(EOT, "\n").splitlines() if ln.strip()]
    words = sorted({w for ln in lines for w in ln.split()})
    # new words from a character trigram model of the real ones (names, compounds, typos of a large web corpus)
    model: dict[str, list[str]] = {}
    for w in words:
        padded = "^^" + w + "$"
        for i in range(len(padded) - 2):
            model.setdefault(padded[i:i + 2], []).append(padded[i + 2])
    invented = set()
    while len(invented) < 150_000:
        ctx, w = "^^", ""
        while len(w) < 20:
            c = rng.choice(model[ctx])
            if c == "$":
                break
            w, ctx = w + c, ctx[1] + c
        if w:
            invented.add(w)
    vocab = words + sorted(invented)
    rng.shuffle(vocab)
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05  # Zipf: a few very common words, a long tail
    p /= p.sum()
    target, written = int(mb * 1e6), 0
    with open(out, "w", encoding="utf-8") as f:
        while written < target:
            ids = nrng.choice(len(vocab), size=200_000, p=p)
            sent_lens = nrng.integers(4, 25, size=20_000)
            pos, parts = 0, []
            for n in sent_lens:
                if pos + n > len(ids):
                    break
                if rng.random() < 0.35:  # a real line
                    parts.append(rng.choice(lines))
                else:
                    s = " ".join(vocab[i] for i in ids[pos:pos + n])
                    parts.append(s[:1].upper() + s[1:] + rng.choice(".....!?;:"))
                pos += n
            # documents of 1-12 sentences, sentences joined by spaces or newlines
            i = 0
            while i < len(parts):
                k = rng.randint(1, 12)
                doc = "".join(s + rng.choice("   \n") for s in parts[i:i + k]).strip()
                f.write(doc + "\n" + EOT + "\n")
                written += len(doc.encode("utf-8")) + len(EOT) + 2
                i += k


def _measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run `cmd`; its own CPU time (user + system), wall time and peak RSS (os.wait4 gives the child's rusage)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode()
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out[-3000:]}")
    return {"cpu": ru.ru_utime + ru.ru_stime, "wall": wall, "rss_mb": ru.ru_maxrss / 1024, "out": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--make-corpus", type=Path, help="write a generated corpus here and exit")
    ap.add_argument("--mb", type=float, default=100, help="size of the generated corpus (MB)")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--corpus", type=Path, help="the corpus both sides prepare (default: a generated one of --mb MB, "
                    "made in a temporary folder)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (tinylm, bare, tinylm, bare ...)")
    ap.add_argument("--extra", nargs="*", default=[], help="extra --data.* arguments for tinylm prepare")
    args = ap.parse_args()
    if args.make_corpus:
        make_corpus(args.make_corpus, args.mb, args.data)
        print(f"wrote {args.make_corpus} ({args.make_corpus.stat().st_size / 1e6:.1f} MB)")
        return
    tinylm = [str(Path(sys.executable).with_name("tinylm"))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_prepare-") as tmp:
        if args.corpus is None:
            args.corpus = Path(tmp) / "corpus.txt"
            make_corpus(args.corpus, args.mb, args.data)
        size_mb = args.corpus.stat().st_size / 1e6
        for r in range(args.rounds):
            for side in ("tinylm", "bare") if r % 2 == 0 else ("bare", "tinylm"):
                cache = Path(tmp) / f"{side}-{r}"
                if side == "tinylm":
                    cmd = [*tinylm, "prepare", "--data.corpus", str(args.corpus), "--data.tokenizer", "bpe",
                           "--data.vocab_size", str(args.vocab), "--data.cache_dir", str(cache), *args.extra]
                    env = {**os.environ, "TQDM_DISABLE": "1"}
                else:
                    cache.mkdir()
                    cmd = [sys.executable, "-c", BARE, str(args.corpus), str(cache / "all.bin"), str(args.vocab)]
                    env = None
                m = _measure(cmd, env)
                m.update(side=side, round=r)
                rows.append(m)
                print(f"round {r} {side:6s}  cpu {m['cpu']:7.1f} s  wall {m['wall']:7.1f} s  "
                      f"rss {m['rss_mb']:6.0f} MB", flush=True)
                shutil.rmtree(cache, ignore_errors=True)
    print(f"\ncorpus {args.corpus} ({size_mb:.1f} MB), vocab {args.vocab}, {os.cpu_count()} cores, "
          f"{args.rounds} round(s)")
    print("| | CPU s | wall s | peak RSS MB | MB/s (wall) |\n|---|---:|---:|---:|---:|")
    agg = {}
    for side in ("tinylm", "bare"):
        ms = [m for m in rows if m["side"] == side]
        agg[side] = {k: sum(m[k] for m in ms) / len(ms) for k in ("cpu", "wall", "rss_mb")}
        a = agg[side]
        print(f"| {side} | {a['cpu']:.1f} | {a['wall']:.1f} | {a['rss_mb']:.0f} | {size_mb / a['wall']:.2f} |")
    ratio = {k: agg["tinylm"][k] / agg["bare"][k] for k in ("cpu", "wall", "rss_mb")}
    print(f"| tinylm / bare | {ratio['cpu']:.2f}x | {ratio['wall']:.2f}x | {ratio['rss_mb']:.2f}x | |")
    print(json.dumps({"corpus_mb": size_mb, "agg": agg, "ratio": ratio}))


if __name__ == "__main__":
    main()
