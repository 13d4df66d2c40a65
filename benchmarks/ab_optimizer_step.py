"""The optimizer step of this checkout beside the same step at an earlier revision (`--rev`): a check that a change
to tinylm/train/optim.py kept the numbers bit for bit and the time the same. A micro-benchmark: it says whether the
step itself changed, never how fast a run is (docs/benchmarks.md has the whole-run figures).

Each side runs in a process of its own (a second side in one process ran 5-10 % slower, whichever it was), the
order alternating over `--pairs`; each times `--steps` optimizer steps of the laptop modern recipe's shapes (4 x 128,
RoPE, RMSNorm, qk-norm, ReLU², untied head) with random gradients, 1 thread, and reports the median step after 20
of warm-up. The ratio printed is the median over the pairs of this checkout's step / the revision's.

    python benchmarks/ab_optimizer_step.py --rev 60b1a97               # Muon (default), 6 pairs of 400 steps
    python benchmarks/ab_optimizer_step.py --rev HEAD~3 --optimizer adamw
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _step_time(optim_file: str, optimizer: str, steps: int) -> tuple[float, list[float]]:
    """The median step of ``steps`` and the weights after them (a checksum per parameter), with the optimizer module
    read from ``optim_file``."""
    import torch

    from tinylm.model import GPT, GPTConfig

    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("optim_under_test", optim_file)
    optim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(optim)
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, positions="rope",
                       norm="rmsnorm", qk_norm=True, mlp="relu2", tie_embeddings=False, pad_vocab_multiple=1)
    torch.manual_seed(0)
    model = GPT(config)
    opt = optim.build_optimizer(model, optimizer=optimizer, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99),
                                muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0, fused=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[20:]), [float(p.double().sum()) for p in model.parameters()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the git revision to compare with (its tinylm/train/optim.py)")
    ap.add_argument("--optimizer", default="muon", choices=["muon", "adamw"])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--side", help=argparse.SUPPRESS)  # one side, in its own process: FILE
    args = ap.parse_args()
    if args.side:
        seconds, weights = _step_time(args.side, args.optimizer, args.steps)
        print(seconds, *weights)
        return
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "optim_old.py"
        old.write_text(subprocess.run(["git", "show", f"{args.rev}:tinylm/train/optim.py"], cwd=ROOT, check=True,
                                      capture_output=True, text=True).stdout)
        files = {"rev": str(old), "here": str(ROOT / "tinylm" / "train" / "optim.py")}

        def side(name: str) -> tuple[float, list[str]]:
            out = subprocess.run([sys.executable, __file__, "--rev", args.rev, "--optimizer", args.optimizer,
                                  "--steps", str(args.steps), "--side", files[name]], check=True,
                                 capture_output=True, text=True).stdout.split()
            return float(out[0]), out[1:]

        ratios = []
        for i in range(args.pairs):
            order = ("rev", "here") if i % 2 == 0 else ("here", "rev")
            got = {name: side(name) for name in order}
            same = got["rev"][1] == got["here"][1]
            ratios.append(got["here"][0] / got["rev"][0])
            print(f"pair {i}: {args.rev} {got['rev'][0] * 1e3:.2f} ms, here {got['here'][0] * 1e3:.2f} ms a step "
                  f"({'same weights' if same else 'OTHER WEIGHTS'} after {args.steps} steps)", flush=True)
    print(f"{args.optimizer} step, this checkout / {args.rev}: median {statistics.median(ratios):.3f} over "
          f"{args.pairs} pairs ({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
