"""AdamW's fused kernel vs its foreach implementation on CPU (tinylm uses the fused one where torch has it:
`tinylm.train.optim.fused_adamw`).

One process, the same model, the same gradients and the same batch on both sides; the two run interleaved in
blocks (fused block, foreach block, ...), so load from other jobs hits both alike. Reported as medians per step:
- optimizer step: `opt.step()` alone, on fixed random gradients (tinylm's parameter groups: decay on matrices);
- training step: forward, loss, backward, clip at 1.0, `opt.step()`, `zero_grad(set_to_none=True)`;
and the largest difference between the two sides' parameters after the same steps (the kernels round differently).

    python benchmarks/bench_adamw.py                 # the laptop recipe and nanoGPT's 6x384 char model
    python benchmarks/bench_adamw.py --threads 1 --blocks 9
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from tinylm.train.module import TinyLM
from tinylm.train.optim import build_optimizer

CONFIGS = {  # name: (TinyLM kwargs, batch size)
    "laptop recipe (4x128, T=64, B=12)": ({"vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4,
                                           "n_embd": 128, "bias": False}, 12),
    "char 6x384 (T=256, B=8)": ({"vocab_size": 65, "block_size": 256, "n_layer": 6, "n_head": 6, "n_embd": 384}, 8),
}


def _side(kwargs: dict, batch: int, fused: bool):
    torch.manual_seed(0)
    module = TinyLM(**kwargs)
    opt = build_optimizer(module.model, optimizer="adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95),
                          muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0, fused=fused)
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=g) * 1e-2 for p in module.parameters()]
    x = torch.randint(0, kwargs["vocab_size"], (batch, kwargs["block_size"]), generator=g)
    y = torch.randint(0, kwargs["vocab_size"], (batch, kwargs["block_size"]), generator=g)

    def opt_step() -> None:
        for p, gr in zip(module.parameters(), grads, strict=True):
            p.grad = gr
        opt.step()

    def train_step() -> None:
        loss = module._loss((x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return module, opt_step, train_step


def _interleaved(fns: dict[str, callable], blocks: int, per_block: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up: the optimizer states exist
    times = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(per_block):
                fn()
            times[name].append((time.perf_counter() - t) / per_block)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("\n| model | what | foreach (ms) | fused (ms) | fused / foreach | max param diff after |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (kwargs, batch) in CONFIGS.items():
        sides = {fused: _side(kwargs, batch, fused) for fused in (False, True)}
        for what, index, per_block in (("optimizer step", 1, 20), ("training step", 2, 4)):
            ms = _interleaved({f: s[index] for f, s in sides.items()}, args.blocks, per_block)
            diff = max((a - b).abs().max().item() for a, b in
                       zip(sides[False][0].parameters(), sides[True][0].parameters(), strict=True))
            print(f"| {name} | {what} | {ms[False] * 1e3:.2f} | {ms[True] * 1e3:.2f} | "
                  f"**{ms[True] / ms[False]:.2f}** | {diff:.1e} |")


if __name__ == "__main__":
    main()
