"""Speculative decoding and constrained decoding against plain decoding, one process, one model pair.

The pair: a target and a draft trained by `tinylm fit` on the same text with the same char tokenizer (by default
the laptop recipe's shape, configs/shakespeare-char-cpu.yaml, as target, and a 1-layer 64-wide model as draft,
each trained --steps steps). For greedy and sampled decoding it reports tokens/s of plain decoding, of speculative
decoding with the draft (K = --k) and with prompt lookup, the ratio to plain, and the acceptance rate (draft tokens
kept / drafted); greedy outputs are checked equal. Then the per-token overhead of a regex constraint (llguidance)
on the same model.

    nice -n 10 python benchmarks/bench_speculative.py --steps 600 --tokens 256
    python benchmarks/bench_speculative.py --target T.ckpt --draft D.ckpt  # a pair you trained
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def train(out: Path, name: str, steps: int, model: dict) -> str:
    """Train one model with `tinylm fit` on the test fixture's tinyshakespeare; returns its last.ckpt."""
    corpus = REPO / "tests/fixtures/tinyshakespeare_100k.txt"
    args = [sys.executable, "-m", "tinylm", "fit", "--config", str(REPO / "configs/shakespeare-char-cpu.yaml"),
            "--data.corpus", str(corpus), "--data.cache_dir", str(out / "cache"), "--run.name", name,
            "--trainer.default_root_dir", str(out), "--trainer.max_steps", str(steps), "--samples.every_n_steps", "0",
            "--trainer.val_check_interval", str(steps), "--run.checkpoint_every", str(steps),
            "--trainer.enable_progress_bar", "false"]
    for key, value in model.items():
        args += [f"--model.{key}", str(value)]
    subprocess.run(args, check=True, cwd=out, stdout=subprocess.DEVNULL)
    return str(out / name / "checkpoints" / "last.ckpt")


def timed(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target"), ap.add_argument("--draft")
    ap.add_argument("--steps", type=int, default=600, help="training steps of each model when not given")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tinylm.checkpoint import load_model
    from tinylm.generate import SamplingConfig, generate_with
    from tinylm.generate import speculative as spec
    from tinylm.generate.rows import CONTEXT_TOKENS, _Rows
    from tinylm.generate.strategies import _prompt_tensor

    with tempfile.TemporaryDirectory() as tmp:
        if not (args.target and args.draft):
            t0 = time.perf_counter()
            args.target = train(Path(tmp), "target", args.steps, {})
            args.draft = train(Path(tmp), "draft", args.steps, {"n_layer": 1, "n_head": 2, "n_embd": 64})
            print(f"trained target and draft, {args.steps} steps each, in {time.perf_counter() - t0:.0f} s")
        target, tok, _ = load_model(args.target)
        draft, draft_tok, _ = load_model(args.draft)
    assert tok.fingerprint == draft_tok.fingerprint
    n_params = lambda m: sum(p.numel() for p in m.parameters()) / 1e6  # noqa: E731
    print(f"torch {torch.__version__}, 1 thread; target {n_params(target):.2f}M params, draft {n_params(draft):.2f}M; "
          f"{args.tokens} new tokens, K = {args.k}, best of {args.repeats}")
    prompt = [tok.encode("ROMEO:\nWhat say you, my lord? ")]

    def run(strategy: str, drafter: str | None):
        config = SamplingConfig(strategy=strategy, max_new_tokens=args.tokens, temperature=0.8, seed=0,
                                num_draft_tokens=args.k, prompt_lookup=3 if drafter == "lookup" else 0)
        if drafter is None:
            return generate_with(target, prompt, config)[0], None
        ids = _prompt_tensor(prompt, target)
        rows = _Rows(config, None, None, [prompt[0][-CONTEXT_TOKENS:]])
        d = spec.DraftModel(draft, ids.size(1), True) if drafter == "draft" else spec.PromptLookup(3)
        with torch.no_grad():
            stats = spec.decode(target, ids, rows, d, torch.Generator().manual_seed(0))
        return rows.tokens[0], stats

    for strategy in ("greedy", "sample"):
        base, (plain, _) = timed(lambda: run(strategy, None), args.repeats)  # noqa: B023
        print(f"{strategy:6s} plain        {len(plain) / base:8.1f} tokens/s")
        for drafter in ("draft", "lookup"):
            secs, (out, stats) = timed(lambda: run(strategy, drafter), args.repeats)  # noqa: B023
            rate = stats["kept"] / max(stats["drafted"], 1)
            same = "" if strategy == "sample" else f"  same text as plain: {out == plain}"
            ratio = base / secs * len(out) / len(plain)
            print(f"{strategy:6s} {drafter:12s} {len(out) / secs:8.1f} tokens/s  {ratio:5.2f}x"
                  f"  acceptance {rate:5.1%}  {len(out) / stats['steps']:4.2f} tokens per target forward{same}")

    regex = r"( ?[A-Z][a-z]{1,8}[,.!?]?( [a-z]{1,8}[,.!?]?){2,12}\n){4,}"
    config = SamplingConfig(strategy="sample", max_new_tokens=args.tokens, temperature=0.8, seed=0)
    free_s, free = timed(lambda: generate_with(target, prompt, config)[0], args.repeats)
    config = SamplingConfig(strategy="sample", max_new_tokens=args.tokens, temperature=0.8, seed=0, regex=regex)
    cons_s, cons = timed(lambda: generate_with(target, prompt, config, tokenizer=tok)[0], args.repeats)
    print(f"regex  plain sample {free_s / len(free) * 1e3:6.2f} ms/token; constrained {cons_s / len(cons) * 1e3:6.2f}"
          f" ms/token: +{(cons_s / len(cons) - free_s / len(free)) * 1e3:.2f} ms/token "
          f"({cons_s / len(cons) / (free_s / len(free)):.2f}x)")
    print("constrained sample:", repr(tok.decode(cons)[:120]))


if __name__ == "__main__":
    main()
