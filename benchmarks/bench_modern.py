"""nanoGPT vs the modern options (each alone, all together, and with Muon) on the laptop recipe, side by side.

Every variant trains from the same seed on the same batches in the same order (fetched once from the recipe's
`TinyLMDataModule`), with the recipe's schedule, clipping and AdamW settings; only the option under test changes.
The model and optimizer are tinylm's own (`TinyLM(...).model`, `tinylm.train.optim.build_optimizer`); the loop is a
plain one so that all variants can run interleaved step by step in one process: step i of every variant runs
before step i + 1 of any, so load from other jobs on a shared machine hits all of them alike.

Reported per variant: parameters, final val/loss and val/bpb (the same fixed validation batches for all, every
`--eval_every` steps), median step time (forward, backward, clip, optimizer step) and its ratio to the baseline, and
the first evaluated step at which val/loss <= the baseline's final val/loss.

    python benchmarks/bench_modern.py --data ../shared/data  # 2000 steps, every variant: ~28 min (1 thread)
    python benchmarks/bench_modern.py --steps 500 --variants baseline,modern+muon --out /tmp/modern
    python benchmarks/bench_modern.py --data ../shared/data --compile --variants baseline,modern,modern+muon \\
        --out /tmp/c
    python benchmarks/bench_modern.py --ops        # the one-node layers (layers.py) vs their plain autograd formulas
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    load_recipe,
    machine_line,
    make_datamodule,
    make_module,
)

from tinylm.train.optim import build_optimizer, fused_adamw
from tinylm.train.schedules import lr_at

REPO = Path(__file__).resolve().parents[1]
MODERN = {"positions": "rope", "norm": "rmsnorm", "qk_norm": True, "mlp": "relu2", "tie_embeddings": False,
          "logit_softcap": 15.0, "zero_init_proj": True}  # = configs/shakespeare-char-cpu-modern.yaml's model options
VARIANTS = {
    "baseline": {},
    "rope": {"positions": "rope"},
    "rmsnorm": {"norm": "rmsnorm"},
    "qk_norm": {"qk_norm": True},
    "swiglu": {"mlp": "swiglu"},
    "relu2": {"mlp": "relu2"},
    "untied": {"tie_embeddings": False},
    "softcap": {"logit_softcap": 15.0},
    "zero_init": {"zero_init_proj": True},
    "modern": MODERN,
    "muon": {"optimizer": "muon"},  # nanoGPT's architecture, Muon for its hidden matrices
    "modern+muon": {**MODERN, "optimizer": "muon"},
}


class Run:
    """One variant: its model, optimizer, clock and validation curve."""

    def __init__(self, name: str, recipe: dict, dm, steps: int, compile_model: bool = False) -> None:
        self.name = name
        module = make_module(recipe, dm, **VARIANTS[name])
        hp = module.hparams
        self.model = module.model.train()
        self.forward = torch.compile(self.model) if compile_model else self.model  # evaluation runs eager
        self.optimizer = build_optimizer(self.model, optimizer=hp.optimizer, lr=hp.lr, weight_decay=hp.weight_decay,
                                         betas=(hp.beta1, hp.beta2), muon_lr=hp.muon_lr,
                                         muon_momentum=hp.muon_momentum, muon_weight_decay=hp.muon_weight_decay,
                                         # the AdamW kernel `tinylm fit` runs (fused on CPU from torch 2.4): with
                                         # foreach, modern + Muon ended 0.008 nats off the CLI's run
                                         fused=fused_adamw(torch.device("cpu")))
        self.peaks = [g["lr"] for g in self.optimizer.param_groups]
        self.factor = [lr_at(s, schedule=hp.lr_schedule, lr=1.0, min_lr=hp.min_lr / hp.lr,
                             warmup_steps=hp.warmup_steps, decay_steps=steps) for s in range(steps)]
        self.clip = recipe["trainer"].get("gradient_clip_val") or float("inf")
        self.params = self.model.num_params()
        self.times: list[float] = []
        self.val: list[tuple[int, float, float]] = []  # (step, val/loss, val/bpb)

    def step(self, i: int, x: torch.Tensor, y: torch.Tensor) -> None:
        t0 = time.perf_counter()
        for group, peak in zip(self.optimizer.param_groups, self.peaks):
            group["lr"] = peak * self.factor[i]  # what the LambdaLR in TinyLM sets: the factor times each peak
        logits = self.forward(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.times.append(time.perf_counter() - t0)

    @torch.no_grad()
    def evaluate(self, step: int, batches: list, token_bytes: torch.Tensor) -> None:
        self.model.eval()
        nats = text_nats = nbytes = count = 0.0
        for x, y in batches:
            logits = self.model(x)
            losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            b = token_bytes[y.reshape(-1)]  # UTF-8 bytes each target stands for (0 for EOS), as val/bpb in TinyLM
            nats, count = nats + float(losses.sum()), count + losses.numel()
            text_nats, nbytes = text_nats + float((losses * (b > 0)).sum()), nbytes + float(b.sum())
        self.model.train()
        self.val.append((step, nats / count, text_nats / math.log(2) / max(nbytes, 1.0)))


def bench_ops(threads: int, repeats: int = 400) -> None:
    """Forward + backward of rms_norm, apply_rope and relu_squared (one autograd node each, hand-written backward)
    against the plain formulas autograd differentiates, at the laptop recipe's shapes (batch 12, block 64, 4 heads
    of 32; q and k together as attention feeds them), interleaved call by call; median microseconds."""
    from tinylm.model.layers import apply_rope, relu_squared, rms_norm, rope_cos_sin

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 64, 128, generator=g, requires_grad=True)  # the residual stream (B, T, C)
    w = torch.ones(128, requires_grad=True)
    qk = torch.randn(12, 64, 2, 4, 32, generator=g, requires_grad=True)  # (B, T, 2, nh, hs)
    h = torch.randn(12, 64, 512, generator=g, requires_grad=True)  # the MLP's hidden activations
    cos, sin = (t[:, None, None, :] for t in rope_cos_sin(torch.arange(64), 32, 10000.0))

    def plain_rope(t):
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    pairs = {
        "rms_norm (B, T, C) with gain": (lambda: rms_norm(x, w),
                                         lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w),
        "qk-norm (B, T, 2, nh, hs)": (lambda: rms_norm(qk), lambda: qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True)
                                                                                      + 1e-6)),
        "rope (B, T, 2, nh, hs)": (lambda: apply_rope(qk, cos, sin), lambda: plain_rope(qk)),
        "relu² (B, T, 4C)": (lambda: relu_squared(h), lambda: torch.relu(h).square()),
        "layer_norm (B, T, C), for scale": (lambda: F.layer_norm(x, (128,), w), lambda: F.layer_norm(x, (128,), w)),
    }
    print(machine_line(), f"threads {threads}")
    print("| op, forward + backward | one node µs | plain autograd µs | plain / one node |\n|---|---|---|---|")
    for name, (fused, plain) in pairs.items():
        times = {fused: [], plain: []}
        for _ in range(repeats):
            for fn in (fused, plain):
                t0 = time.perf_counter()
                fn().sum().backward()
                times[fn].append(time.perf_counter() - t0)
        a, b = (statistics.median(times[fn][repeats // 10 :]) * 1e6 for fn in (fused, plain))
        print(f"| {name} | {a:.0f} | {b:.0f} | {b / a:.2f}× |")
    optimizer_steps(repeats // 4)


def optimizer_steps(repeats: int) -> None:
    """What one optimizer step costs on the recipe's model: AdamW on everything; Muon (hidden matrices) + AdamW (the
    rest) as torch.optim.Muon.step() computes it, one matrix at a time; as tinylm steps it (`muon_step`: the
    Newton–Schulz iterations of same-shape matrices batched), with the same maths as torch's and with c_attn's q, k
    and v orthogonalised apart (as tinylm trains), its Newton-Schulz iterations in bf16 (torch's) and in fp32 (tinylm's
    default on a CPU); beside the forward + backward of a batch of 12 x 64 tokens; interleaved, median milliseconds."""
    from tinylm.model import GPT, GPTConfig
    from tinylm.train.optim import MuonAdamW

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, bias=False, vocab_size=65, block_size=64, **MODERN))
    x = torch.randint(0, 65, (12, 65))
    settings = {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.99), "muon_lr": 0.02, "muon_momentum": 0.95,
                "muon_weight_decay": 0.0, "fused": False}
    adamw = build_optimizer(model, optimizer="adamw", **settings)
    muon = build_optimizer(model, optimizer="muon", **settings)
    assert isinstance(muon, MuonAdamW)

    splits = muon.splits

    def torch_muon() -> None:
        muon.adamw.step()
        muon.muon.step()

    def tinylm_muon(split: bool, ns_dtype: torch.dtype | None) -> None:  # the same maths as torch's step (bf16,
        muon.splits = splits if split else {}  # q, k, v as one), or with q, k, v apart, in the device's precision
        muon.ns_dtype = ns_dtype
        muon.step()

    fp32 = "tinylm Muon + AdamW, q/k/v apart, Newton-Schulz in fp32 (tinylm's CPU default)"
    steps = {"adamw": adamw.step, "torch.optim.Muon + AdamW": torch_muon,
             "tinylm Muon + AdamW": lambda: tinylm_muon(False, torch.bfloat16),
             "tinylm Muon + AdamW, q/k/v apart, Newton-Schulz in bf16": lambda: tinylm_muon(True, torch.bfloat16),
             fp32: lambda: tinylm_muon(True, None)}
    times = {"forward + backward": [], **{name: [] for name in steps}}
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits = model(x[:, :-1])
        F.cross_entropy(logits.reshape(-1, 65), x[:, 1:].reshape(-1)).backward()
        times["forward + backward"].append(time.perf_counter() - t0)
        for name, step in steps.items():  # the same gradients for each: step() does not clear them
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    ms = {k: statistics.median(v[repeats // 10 :]) * 1e3 for k, v in times.items()}
    print(f"\nmodern model, batch 12 x 64: forward + backward {ms['forward + backward']:.1f} ms; optimizer step: "
          + ", ".join(f"{name} {t:.2f} ms" for name, t in ms.items() if name in steps)
          + f"; tinylm's Muon step {ms['torch.optim.Muon + AdamW'] / ms['tinylm Muon + AdamW']:.2f}× faster than "
          f"torch's (both bf16); Newton-Schulz in fp32 "
          f"{ms['tinylm Muon + AdamW, q/k/v apart, Newton-Schulz in bf16'] / ms[fp32]:.2f}× faster than in bf16 "
          f"(q/k/v apart), +{ms[fp32] - ms['adamw']:.2f} ms over AdamW")


def first_reaching(val: list[tuple[int, float, float]], target: float) -> int | None:
    return next((s for s, loss, _ in val if loss <= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding tinyshakespeare.txt")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's max_steps)")
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--val_batches", type=int, default=20, help="fixed validation batches (the recipe's 20)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch_size", type=int, default=None, help="sequences per step (default: the recipe's 12); "
                    "Muon's cost per step does not grow with it, the model's does")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "modern")
    ap.add_argument("--plot", type=Path, nargs="+", help="only draw these results.json files side by side into "
                    "--out/modern.png (e.g. a long run of a few variants beside a short one of every option)")
    ap.add_argument("--compile", action="store_true", help="torch.compile every variant's model (model.compile_model: "
                    "true), as the speedruns train; the first steps then include compiling")
    ap.add_argument("--ops", action="store_true", help="only time the one-node layers against the plain formulas")
    args = ap.parse_args()
    if args.ops:
        bench_ops(args.threads)
        return
    if args.plot:
        results = [json.loads(p.read_text()) for p in args.plot]
        args.out.mkdir(parents=True, exist_ok=True)
        plot([(r["rows"], r["meta"]["steps"]) for r in results], args.out / "modern.png")
        return
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.config)
    if args.batch_size:
        recipe["data"]["batch_size"] = args.batch_size
    steps = args.steps or recipe["trainer"]["max_steps"]
    names = args.variants.split(",")
    with tempfile.TemporaryDirectory() as cache:
        dm = make_datamodule(recipe, args.data, Path(cache), val_batches=args.val_batches)
        loader, batches = dm.train_dataloader(), []
        while len(batches) < steps:  # a notional epoch ends; the same loader goes on with new windows, as in fit
            batches += list(itertools.islice(loader, steps - len(batches)))
        val_batches = list(dm.val_dataloader())[: args.val_batches]
        token_bytes = torch.tensor(dm.tokenizer.token_byte_lengths(), dtype=torch.float64)
    runs = [Run(n, recipe, dm, steps, args.compile) for n in names]
    print(machine_line(), flush=True)
    for i, (x, y) in enumerate(batches):
        for run in runs:  # interleaved: every variant takes step i before any takes step i + 1
            run.step(i, x, y)
        if (i + 1) % args.eval_every == 0 or i + 1 == steps:
            for run in runs:
                run.evaluate(i + 1, val_batches, token_bytes)
            print(f"step {i + 1}: " + ", ".join(f"{r.name} {r.val[-1][1]:.4f}" for r in runs), flush=True)
            args.out.mkdir(parents=True, exist_ok=True)  # curves so far, should the run be cut short
            (args.out / "partial.json").write_text(json.dumps({r.name: r.val for r in runs}))
    report(runs, steps, args, recipe)


def report(runs: list[Run], steps: int, args, recipe: dict) -> None:
    base = runs[0]
    target = base.val[-1][1]
    warm = min(50, steps // 10)
    base_time = statistics.median(base.times[warm:])
    rows = []
    for r in runs:
        reach = first_reaching(r.val, target)
        t = statistics.median(r.times[warm:])
        rows.append({"variant": r.name, "params": r.params, "val_loss": r.val[-1][1], "val_bpb": r.val[-1][2],
                         "step_ms": 1000 * t, "step_ratio": t / base_time, "reaches_baseline_at": reach,
                         "steps_ratio": None if reach is None else reach / steps,
                         "param_ratio": r.params / base.params, "curve": r.val})
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine_line(), "steps": steps, "compile": args.compile, "eval_every": args.eval_every,
                "val_batches": args.val_batches, "config": str(args.config), "recipe_model": recipe["model"],
                "batch_size": recipe["data"]["batch_size"]}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{meta['machine']}; {steps} steps{', compiled' if args.compile else ''}; "
          f"target = baseline final val/loss {target:.4f}\n")
    print("| variant | params | val/loss | val/bpb | Δ loss vs baseline | step ms | step × | reaches baseline at |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        reach = "—" if row["reaches_baseline_at"] is None else \
            f"{row['reaches_baseline_at']} ({row['steps_ratio']:.2f}×)"
        print(f"| {row['variant']} | {row['params'] / 1e6:.3f}M ({row['param_ratio']:.2f}×) | {row['val_loss']:.4f} | "
              f"{row['val_bpb']:.3f} | {row['val_loss'] - target:+.4f} | {row['step_ms']:.1f} | "
              f"{row['step_ratio']:.2f} | {reach} |")
    plot([(rows, steps)], args.out / "modern.png")


def plot(panels: list[tuple[list[dict], int]], path: Path) -> None:
    """One panel of val curves per run (rows, steps); the baseline's final val/loss dotted in each."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no picture")
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False)
    for ax, (rows, n_steps) in zip(axes[0], panels):
        target = rows[0]["val_loss"]  # the first variant is the baseline
        for row in rows:
            steps, losses = zip(*[(s, v) for s, v, _ in row["curve"]])
            bold = row["variant"] in ("baseline", "modern", "muon", "modern+muon")
            color = {"baseline": "black", "modern": "tab:blue", "muon": "darkgoldenrod",
                     "modern+muon": "tab:red"}.get(row["variant"])
            ax.plot(steps, losses, label=row["variant"], color=color, linewidth=2.2 if bold else 0.9,
                    alpha=1.0 if bold else 0.8)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1, label="baseline final")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("val/loss (nats per char)")
        lowest = min(v for row in rows for _, v, _ in row["curve"])
        ax.set_ylim(lowest - 0.05, target + 0.75)
        ax.set_title(f"laptop recipe, {n_steps} steps: {len(rows)} variants")
        ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"picture: {path}")


if __name__ == "__main__":
    main()
