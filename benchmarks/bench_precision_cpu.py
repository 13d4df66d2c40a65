"""Lightning `precision="32-true"` vs `"bf16-mixed"` on this CPU: step time, and the loss each reaches.

One process: the same `TinyLM` init (same seed), the same batches, two `Trainer`s that differ only in precision.
The two fits run in two threads that take strict turns (a callback hands over after every `--block` steps and
waits for its next turn), so exactly one of them computes at any moment and load from other jobs on a shared
machine hits both alike. After training, both models are evaluated in fp32 on the same validation batches.

`tinylm fit` picks bf16-mixed on CPUs with AVX512-BF16/AMX and 32-true elsewhere (`tinylm.cli.resolve_precision`);
this measures whether that default pays on the machine at hand.

    python benchmarks/bench_precision_cpu.py                    # laptop recipe, 200 steps each
    python benchmarks/bench_precision_cpu.py --steps 400 --threads 1
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    Clock,
    StepEnd,
    StepStart,
    load_recipe,
    machine_line,
    make_datamodule,
    make_module,
    quiet_lightning,
)

PRECISIONS = ("32-true", "bf16-mixed")


class Baton:
    """Strict turns between named parties: one runs until it passes the baton, then waits for its next turn."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.turn, self.done = names, names[0], set[str]()
        self.cond = threading.Condition()

    def _next(self, me: str) -> str | None:
        i = self.names.index(me)
        rest = self.names[i + 1:] + self.names[: i + 1]
        return next((n for n in rest if n not in self.done), None)

    def wait(self, me: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == me)

    def pass_on(self, me: str) -> None:
        with self.cond:
            self.turn = self._next(me)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.turn == me)

    def finish(self, me: str) -> None:
        with self.cond:
            self.done.add(me)
            self.turn = self._next(me)
            self.cond.notify_all()


class TakeTurns(L.Callback):
    """Waits for its turn before the fit sets up, and passes the baton on after every `block` training steps."""

    def __init__(self, baton: Baton, me: str, block: int) -> None:
        self.baton, self.me, self.block = baton, me, block

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.baton.wait(self.me)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (batch_idx + 1) % self.block == 0:
            self.baton.pass_on(self.me)


@torch.no_grad()
def fp32_val_loss(model: torch.nn.Module, dm) -> float:
    """Mean cross-entropy (nats/token) of `model` in fp32 over the data module's validation batches."""
    total, n = 0.0, 0
    for x, y in dm.val_dataloader():  # (B, T) each
        logits = model(x)  # (B, T, V)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), reduction="sum").item()
        n += y.numel()
    return total / n


def run(recipe: dict[str, Any], data_dir: Path, tmp: Path, *, steps: int, warmup: int, block: int,
        val_batches: int) -> dict[str, dict[str, Any]]:
    """Train one model per precision, interleaved; return clocks, modules and data modules by precision."""
    total = -(-(warmup + steps) // block) * block
    baton = Baton(list(PRECISIONS))
    runs: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS:
        dm = make_datamodule(recipe, data_dir, tmp / "cache", val_batches=val_batches)
        lit = make_module(recipe, dm)  # seeded: both precisions start from the same weights
        clock = Clock()
        trainer = L.Trainer(
            accelerator="cpu", devices=1, precision=precision, max_steps=total, max_epochs=None,
            check_val_every_n_epoch=None, limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
            gradient_clip_val=float(recipe["trainer"].get("gradient_clip_val") or 1.0), logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=str(tmp / precision),
            callbacks=[StepStart(clock), StepEnd(clock), TakeTurns(baton, precision, block)],
        )
        runs[precision] = {"dm": dm, "lit": lit, "clock": clock, "trainer": trainer, "error": None}
    if not all(torch.equal(a, b) for a, b in zip(*(r["lit"].model.state_dict().values() for r in runs.values()))):
        raise AssertionError("the two models do not start from the same weights")

    def fit(precision: str) -> None:
        r = runs[precision]
        try:
            r["trainer"].fit(r["lit"], datamodule=r["dm"])
        except BaseException as e:  # noqa: BLE001 (re-raised in the main thread)
            r["error"] = e
        finally:
            baton.finish(precision)

    threads = [threading.Thread(target=fit, args=(p,), name=f"fit-{p}") for p in PRECISIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in runs.values():
        if r["error"] is not None:
            raise r["error"]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="recipe whose model/data shapes to use")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding tinyshakespeare.txt")
    parser.add_argument("--steps", type=int, default=200, help="training steps per precision after warm-up")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps at the start of each run")
    parser.add_argument("--block", type=int, default=10, help="steps one precision runs before the other takes over")
    parser.add_argument("--val-batches", type=int, default=20, help="validation batches for the final fp32 loss")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_lightning()
    recipe = load_recipe(args.config)
    m, d = recipe["model"], recipe["data"]
    print(f"machine: {machine_line()}", flush=True)
    print(f"model: {args.config.name}: n_layer {m['n_layer']}, n_head {m['n_head']}, n_embd {m['n_embd']}, "
          f"block {d['block_size']}, batch {d['batch_size']}, dropout {m.get('dropout', 0.0)}; "
          f"{args.warmup} warm-up + {args.steps} timed steps per precision, interleaved in blocks of {args.block}")
    with tempfile.TemporaryDirectory() as tmp:
        runs = run(recipe, args.data, Path(tmp), steps=args.steps, warmup=args.warmup, block=args.block,
                   val_batches=args.val_batches)
        rows = {}
        for precision, r in runs.items():
            c: Clock = r["clock"]
            blocks = c.block_medians(args.warmup, args.block)
            rows[precision] = {
                "step": statistics.median(c.steps[args.warmup:]),
                "cpu": statistics.median(c.cpu_steps[args.warmup:]),
                "blocks": blocks,
                "steps": len(c.steps),
                "train": statistics.mean(c.losses[-20:]),
                "val": fp32_val_loss(r["lit"].model.eval(), r["dm"]),
            }
    a, b = rows["32-true"], rows["bf16-mixed"]
    paired = statistics.median(x / y for x, y in zip(b["blocks"], a["blocks"]))
    print("\nmedian ms per optimizer step (on_train_batch_start -> on_train_batch_end); losses in nats/token")
    print(f"| precision | steps | step (ms) | step CPU time (ms) | mean train loss, last 20 steps "
          f"| val loss (fp32 eval, {args.val_batches} batches) |")
    print("|---|---:|---:|---:|---:|---:|")
    for precision, r in rows.items():
        print(f"| {precision} | {r['steps']} | {r['step'] * 1e3:.1f} | {r['cpu'] * 1e3:.1f} | {r['train']:.5f} | "
              f"{r['val']:.5f} |")
    faster = "32-true" if b["step"] > a["step"] else "bf16-mixed"
    print(f"\nbf16-mixed / 32-true step time: {b['step'] / a['step']:.3f} (paired blocks {paired:.3f}, "
          f"CPU time {b['cpu'] / a['cpu']:.3f}); faster here: {faster}")
    print(f"val loss bf16-mixed - 32-true: {b['val'] - a['val']:+.4f} nats/token "
          f"(ppl x{math.exp(b['val'] - a['val']):.3f})")
    print(f"after: {machine_line()}")


if __name__ == "__main__":
    main()
