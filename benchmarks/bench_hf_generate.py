"""Greedy generation speed: tinylm's `generate` vs transformers' `GPT2LMHeadModel.generate` on the same weights, CPU.

For each model shape: a tinylm checkpoint (a real `trainer.save_checkpoint` file of a randomly initialised model,
or --ckpt_path), exported with `tinylm.hf.export_hf` and loaded back with `GPT2LMHeadModel.from_pretrained`;
both continue the same prompt greedily with a KV cache for --new-tokens tokens (EOS does not stop either). Checks
the two return identical token ids and prints tokens/s and the ratio as a markdown table.

    python benchmarks/bench_hf_generate.py                      # both shapes, 64-token prompt, 256 new tokens
    python benchmarks/bench_hf_generate.py --ckpt_path runs/x/last.ckpt --prompt "ROMEO:"
"""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
import warnings
from pathlib import Path

import torch

from tinylm.checkpoint import load_model
from tinylm.generate.strategies import generate
from tinylm.hf import export_hf

# block_size 512 so a 64-token prompt + 256 new tokens fit in the window (transformers' GPT-2 cannot slide past it)
SHAPES = {
    # the CPU laptop recipe's shape (character-level vocab)
    "laptop": {"vocab_size": 65, "block_size": 512, "n_layer": 4, "n_head": 4, "n_embd": 128},
    # a 6-layer 384-wide model with the GPT-2 BPE vocab (padded to 50304 rows in tinylm, 50257 in the export)
    "small": {"vocab_size": 50257, "block_size": 512, "n_layer": 6, "n_head": 6, "n_embd": 384},
}


def random_checkpoint(shape: dict, path: Path) -> Path:
    """Write a real Lightning checkpoint of a randomly initialised TinyLM (one optimizer step at a negligible lr)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from tinylm.train.module import TinyLM

    torch.manual_seed(0)
    module = TinyLM(**shape, lr=1e-12, min_lr=0.0, warmup_steps=0)
    data = torch.randint(0, shape["vocab_size"], (1, 33))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=1))
    trainer.save_checkpoint(path)
    return path


def timed(fn) -> tuple[list[int], float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench(ckpt: Path, out_dir: Path, *, prompt: list[int] | None, prompt_len: int, new_tokens: int,
          repeats: int) -> dict:
    from transformers import GenerationConfig, GPT2LMHeadModel

    model, _tokenizer, _ = load_model(ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no tokenizer in the checkpoint" for the random models
        export_hf(ckpt, out_dir)
    hf = GPT2LMHeadModel.from_pretrained(out_dir).eval()
    c = model.config
    if prompt is None:
        prompt = torch.randint(0, c.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    if len(prompt) + new_tokens > c.block_size:
        raise ValueError(f"prompt ({len(prompt)}) + --new-tokens ({new_tokens}) must fit block_size {c.block_size}")
    ids = torch.tensor([prompt])  # (1, P)
    # no EOS, no minimum: both run exactly new_tokens steps of plain argmax
    def config(n: int) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=n, do_sample=False, use_cache=True, num_beams=1, eos_token_id=None,
                                pad_token_id=None, bos_token_id=None)

    def ours(n: int) -> list[int]:
        return generate(model, ids, strategy="greedy", max_new_tokens=n, use_cache=True)[0]

    def theirs(n: int) -> list[int]:
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config(n))
        return out[0, ids.size(1):].tolist()

    ours(8), theirs(8)  # warm-up: allocator, kernels, transformers' first-call setup
    best = {"tinylm": math.inf, "transformers": math.inf}
    outputs = {}
    for _ in range(repeats):  # alternate, keep the best: the machine is shared, noise only ever adds time
        for name, fn in (("tinylm", ours), ("transformers", theirs)):
            outputs[name], seconds = timed(lambda fn=fn: fn(new_tokens))
            best[name] = min(best[name], seconds)
    same = outputs["tinylm"] == outputs["transformers"]
    first_diff = next((i for i, (a, b) in enumerate(zip(*outputs.values())) if a != b), None)
    n = len(outputs["tinylm"])
    assert n == len(outputs["transformers"]) == new_tokens, (n, len(outputs["transformers"]))
    return {
        "model": f"{c.n_layer}L {c.n_head}H {c.n_embd}d, vocab {c.vocab_size}, {model.num_params() / 1e6:.1f}M",
        "tinylm": n / best["tinylm"], "transformers": n / best["transformers"],
        "ratio": best["transformers"] / best["tinylm"], "same": same, "first_diff": first_diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="laptop,small", help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--ckpt_path", default=None, help="benchmark this checkpoint instead of random models")
    parser.add_argument("--prompt", default=None, help="prompt text (needs --ckpt_path; default: random ids)")
    parser.add_argument("--prompt-len", type=int, default=64, help="random prompt length in tokens")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side; the best is reported")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 = steady numbers on a busy machine; 0 keeps torch's default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    print(f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
          f"{transformers.__version__}; batch 1, greedy, KV cache, {args.new_tokens} new tokens, best of "
          f"{args.repeats}\n")
    print("| model | tinylm (tok/s) | transformers (tok/s) | tinylm speed / transformers | identical ids |")
    print("|---|---:|---:|---:|:---:|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.ckpt_path:
            runs = [("checkpoint", Path(args.ckpt_path))]
        else:
            runs = [(name, random_checkpoint(SHAPES[name], tmp / f"{name}.ckpt")) for name in args.models.split(",")]
        for name, ckpt in runs:
            prompt = None
            if args.prompt is not None:
                _, tokenizer, _ = load_model(ckpt)
                prompt = tokenizer.encode(args.prompt)
            r = bench(ckpt, tmp / f"{name}-hf", prompt=prompt, prompt_len=args.prompt_len,
                      new_tokens=args.new_tokens, repeats=args.repeats)
            same = "yes" if r["same"] else f"no (from token {r['first_diff']})"
            print(f"| {name}: {r['model']} | {r['tinylm']:.0f} | {r['transformers']:.0f} | {r['ratio']:.2f}x | "
                  f"{same} |", flush=True)


if __name__ == "__main__":
    main()
