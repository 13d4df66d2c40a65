"""Is de-duplication worth it? The laptop recipe (configs/shakespeare-char-cpu.yaml) trained on tinyshakespeare with
30 % of its scenes repeated, once as it comes and once with `--data.clean.exact true`, each model then evaluated on
both validation splits.

The corpus: tinyshakespeare cut into "scenes" of `--speeches` consecutive speeches (blank-line separated blocks;
the text marks no real scenes), one document each, plus a copy of 30 % of the scenes of its first 90 % inserted at
a random place. Without cleaning, the validation tail (val_fraction 0.1) holds some of those copies: text the model
also trained on. With exact de-duplication the kept documents are the scenes once each, so the tail is the
original text's last 10 %: a clean split. Both models are scored on both splits with `tinylm validate` (whole
splits), so the table compares models on the same text.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/dedup_worth_it.py --data ../shared/data --max_steps 1000
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

EOT = "<|endoftext|>"
REPO = Path(__file__).resolve().parents[1]


def make_corpus(source: Path, out: Path, speeches: int, share: float, seed: int = 0) -> dict:
    """Write the scenes and their copies to `out`, separated by <|endoftext|>; return the counts."""
    blocks = [b.strip() for b in source.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    scenes = ["\n\n".join(blocks[i : i + speeches]) for i in range(0, len(blocks), speeches)]
    total, seen, head = sum(map(len, scenes)), 0, 0
    for scene in scenes:  # the scenes wholly inside the first 90 % of the text
        seen += len(scene)
        head += seen <= 0.9 * total
    rng = random.Random(seed)
    docs = list(scenes)
    for scene in rng.sample(scenes[:head], int(share * len(scenes))):
        docs.insert(rng.randrange(len(docs) + 1), scene)
    out.write_text(f"\n{EOT}\n".join(docs), encoding="utf-8")
    return {"scenes": len(scenes), "copies": len(docs) - len(scenes)}


def _tinylm(cwd: str, *args: str) -> str:
    cmd = [sys.executable, "-m", "tinylm", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)  # runs/ lands in cwd
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="folder of tinyshakespeare.txt")
    ap.add_argument("--max_steps", type=int, default=1000, help="the recipe's 2000, or fewer on a busy machine")
    ap.add_argument("--speeches", type=int, default=25, help="speeches per scene")
    ap.add_argument("--share", type=float, default=0.3, help="share of the scenes repeated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dedup_worth_it-") as tmp:
        corpus = Path(tmp) / "shakespeare_repeated.txt"
        counts = make_corpus(args.data / "tinyshakespeare.txt", corpus, args.speeches, args.share)
        print(f"{counts['scenes']} scenes, {counts['copies']} copies", flush=True)
        common = ["--config", str(REPO / "configs" / "shakespeare-char-cpu.yaml"), "--data.corpus", str(corpus),
                  "--data.cache_dir", f"{tmp}/cache"]
        cleaning = {"as it comes": ["--data.clean.exact", "false"], "exact dedup": ["--data.clean.exact", "true"]}
        ckpts = {}
        for name, flags in cleaning.items():
            run = f"dedup-{len(ckpts)}"
            _tinylm(tmp, "fit", *common, *flags, "--run.name", run, "--trainer.max_steps", str(args.max_steps),
                    "--samples.every_n_steps", "0")
            ckpts[name] = f"{tmp}/runs/{run}/checkpoints/last.ckpt"
            print(f"trained {name}", flush=True)
        print("\n| trained on | val/bpb, its own split | val/bpb, the other split |\n|---|---:|---:|")
        for name, ckpt in ckpts.items():
            bpb = {}
            for split, flags in cleaning.items():
                out = _tinylm(tmp, "validate", *common, *flags, "--ckpt_path", ckpt, "--data.val_batches", "null")
                bpb[split] = float(re.search(r"val/bpb (\S+)", out)[1])
            other = next(s for s in cleaning if s != name)
            print(f"| {name} ({args.max_steps} steps) | {bpb[name]:.4f} | {bpb[other]:.4f} ({other}) |", flush=True)


if __name__ == "__main__":
    main()
