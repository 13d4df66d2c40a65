"""What `data.clean` costs: `tinylm prepare` with de-duplication (and the quality rules) beside `tinylm prepare`
without cleaning, on a corpus with injected duplicates, and how many of them it found.

The corpus is bench_prepare.py's generated one (real lines of ../shared/data shuffled with Zipf-distributed and
invented words, documents of 1-12 sentences) plus injected duplicates: `--exact` of the documents again, re-cased
or re-wrapped, and `--near` again with 1 % of their words (at least one) replaced, taken from documents of 50 words
or more (shorter ones with one word changed are not near-duplicates at Jaccard 0.8), all shuffled in after the
originals. Each configuration runs `tinylm prepare` (BPE 8192, as bench_prepare.py) in its own subprocess, so the
CPU time (user + system), wall time and peak RSS are its own; the table gives them and the ratios to the run
without cleaning, and the cleaned runs' recall of the injected copies (removed by `exact`, less the generator's own
exact duplicates, and by `near`, over injected; a run with the quality rules finds fewer: they remove copies first).

    nice -n 10 python benchmarks/bench_clean.py --mb 100
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prepare import EOT, _measure, make_corpus

GOPHER = ["--data.clean.min_words", "50", "--data.clean.max_words", "100000", "--data.clean.min_mean_word_length",
          "3", "--data.clean.max_mean_word_length", "10", "--data.clean.max_symbol_ratio", "0.1",
          "--data.clean.max_duplicate_lines", "0.3", "--data.clean.max_duplicate_ngrams", "0.15"]
CONFIGS = {
    "none": [],
    "exact+near": ["--data.clean.exact", "true", "--data.clean.near", "true"],
    "exact+near+decontaminate+gopher": ["--data.clean.exact", "true", "--data.clean.near", "true",
                                        "--data.clean.decontaminate", "true", *GOPHER],
}


def inject(path: Path, exact: float, near: float, seed: int = 0) -> dict:
    """Append copies of `path`'s documents to it (see the module docstring); return how many of each kind."""
    rng = random.Random(seed)
    docs = [d.strip() for d in path.read_text(encoding="utf-8").split(EOT) if d.strip()]
    keys = Counter(" ".join(d.lower().split()) for d in docs)  # exact_key's normalisation
    natural = sum(n - 1 for n in keys.values())  # duplicates the generator made (one-line documents, mostly)
    docs = [d for d in docs if keys[" ".join(d.lower().split())] == 1]  # copies of these are the injected truth
    copies = []
    for doc in rng.sample(docs, int(exact * len(docs))):
        copies.append(doc.upper() if rng.random() < 0.5 else doc.replace(" ", "  \n", 3))
    long_docs = [d for d in docs if len(d.split()) >= 50]
    n_near = min(len(long_docs), int(near * len(docs)))
    for doc in rng.sample(long_docs, n_near):
        words = doc.split(" ")
        for i in rng.sample(range(len(words)), max(1, len(words) // 100)):
            words[i] = f"zq{rng.randrange(10**9)}"
        copies.append(" ".join(words))
    rng.shuffle(copies)
    with open(path, "a", encoding="utf-8") as f:
        for doc in copies:
            f.write(doc + "\n" + EOT + "\n")
    return {"documents": len(keys) + natural, "natural_exact": natural, "exact": len(copies) - n_near, "near": n_near}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=100, help="size of the generated corpus before the copies (MB)")
    ap.add_argument("--exact", type=float, default=0.1, help="exact copies injected, as a share of the documents")
    ap.add_argument("--near", type=float, default=0.1, help="near copies injected, as a share of the documents")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    args = ap.parse_args()
    tinylm = [str(Path(sys.executable).with_name("tinylm"))]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench_clean-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        make_corpus(corpus, args.mb, args.data)
        injected = inject(corpus, args.exact, args.near)
        size_mb = corpus.stat().st_size / 1e6
        print(f"corpus {size_mb:.1f} MB: {injected}", flush=True)
        for name in args.configs:
            cache = Path(tmp) / name
            cmd = [*tinylm, "prepare", "--data.corpus", str(corpus), "--data.tokenizer", "bpe",
                   "--data.vocab_size", "8192", "--data.cache_dir", str(cache), *CONFIGS[name]]
            m = _measure(cmd, {**os.environ, "TQDM_DISABLE": "1"})
            report = next(cache.glob("datasets/*/clean.json"), None)
            m["removed"] = json.loads(report.read_text())["removed"] if report else {}
            rows[name] = m
            print(f"{name:34s} cpu {m['cpu']:7.1f} s  wall {m['wall']:7.1f} s  rss {m['rss_mb']:6.0f} MB  removed "
                  f"{ {k: v['documents'] for k, v in m['removed'].items()} }", flush=True)
    base = rows.get("none")
    print(f"\ncorpus {size_mb:.1f} MB ({injected}), {os.cpu_count()} cores")
    print("| cleaning | CPU s | wall s | peak RSS MB | CPU ratio | wall ratio | exact recall | near recall |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, m in rows.items():
        ratio = {k: f"{m[k] / base[k]:.2f}x" if base else "" for k in ("cpu", "wall")}
        found = {"exact": m["removed"].get("exact", {}).get("documents", 0) - injected["natural_exact"],
                 "near": m["removed"].get("near", {}).get("documents", 0)}
        recall = {k: f"{found[k] / injected[k]:.3f}" if k in m["removed"] else "" for k in ("exact", "near")}
        print(f"| {name} | {m['cpu']:.1f} | {m['wall']:.1f} | {m['rss_mb']:.0f} | {ratio['cpu']} | {ratio['wall']} "
              f"| {recall['exact']} | {recall['near']} |")
    print(json.dumps({"corpus_mb": size_mb, "injected": injected,
                      "rows": {k: {x: v[x] for x in ("cpu", "wall", "rss_mb", "removed")} for k, v in rows.items()}},
                     default=str)[:4000])


if __name__ == "__main__":
    main()
