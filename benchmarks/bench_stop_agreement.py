"""What the ranks' stop agreement costs under DDP: once per optimizer step vs about once a second.

Under several ranks, `InterruptStop` makes every rank stop at the same step after a SIGTERM or Ctrl+C (one rank
may have missed the signal). Agreeing is a collective and, on GPUs, a host sync. This benchmark runs one real
`tinylm fit` on 2 CPU ranks (DDP, gloo) and alternates, in blocks of optimizer steps, between agreeing on every
step (`AGREE_EVERY_S = 0`, what tinylm did before) and the shipped cadence (`AGREE_EVERY_S = 1.0`): the same
processes, model and data, so load from other jobs hits both alike. It reports the median time per step of each
kind of block (the first blocks are warm-up) and how many steps each agreement covered.

    python benchmarks/bench_stop_agreement.py                           # laptop recipe's model, 2 ranks
    python benchmarks/bench_stop_agreement.py --blocks 12 --block 60 --n_layer 2 --n_embd 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from tinylm.train import interrupt

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "shakespeare-char-cpu.yaml"
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
CADENCES = {"every step": 0.0, "about once a second": 1.0}


class Alternate(L.Callback):
    """Switches `interrupt.AGREE_EVERY_S` every ``block`` optimizer steps, starting each block with an agreement
    (so the two kinds of block differ only in what follows it); rank 0 writes its timings to ``$BENCH_OUT``."""

    def __init__(self, block: int = 40) -> None:
        self.block, self.blocks, self.started = block, [], None
        self._counted = -1  # the step whose agreement was last counted

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.block:
            return
        now = time.perf_counter()
        stop = next(c for c in trainer.callbacks if isinstance(c, interrupt.InterruptStop))
        if self.started is not None:
            self.blocks[-1]["seconds_per_step"] = (now - self.started) / self.block
        name = list(CADENCES)[(step // self.block) % 2]
        interrupt.AGREE_EVERY_S = CADENCES[name]
        stop._next_agreement = step  # agree now (this hook runs before the stop callback's)
        self.blocks.append({"cadence": name, "first_step": step, "agreements": 0})
        self.started = now

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        stop = next(c for c in trainer.callbacks if isinstance(c, interrupt.InterruptStop))
        if self.blocks and stop._agreed_at[1] == trainer.global_step and trainer.global_step != self._counted:
            self.blocks[-1]["agreements"] += 1
        self._counted = trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            Path(os.environ["BENCH_OUT"]).write_text(json.dumps([b for b in self.blocks if "seconds_per_step" in b]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="a text file")
    parser.add_argument("--block", type=int, default=40, help="optimizer steps per block")
    parser.add_argument("--blocks", type=int, default=10, help="blocks in all (half of each kind)")
    parser.add_argument("--warmup", type=int, default=2, help="blocks left out of the medians")
    parser.add_argument("--n_layer", type=int, default=None)
    parser.add_argument("--n_embd", type=int, default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "blocks.json"
        steps = args.block * (args.blocks + 1)
        cmd = [sys.executable, "-m", "tinylm", "fit", "--config", str(args.config), "--data.corpus", str(args.corpus),
               "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
               "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
               "--trainer.limit_val_batches", "1", "--trainer.num_sanity_val_steps", "0",
               "--trainer.enable_progress_bar", "false", "--run.checkpoint_every", str(steps),
               "--samples.every_n_steps", "0",
               "--trainer.callbacks+=bench_stop_agreement.Alternate", f"--trainer.callbacks.block={args.block}"]
        if args.n_layer:
            cmd += ["--model.n_layer", str(args.n_layer)]
        if args.n_embd:
            cmd += ["--model.n_embd", str(args.n_embd)]
        paths = [str(Path(__file__).parent), str(REPO), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "BENCH_OUT": str(out), "WANDB_MODE": "disabled"}
        subprocess.run(cmd, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        blocks = json.loads(out.read_text())[args.warmup:]

    print(f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, lightning {L.__version__}; "
          f"2 ranks (DDP, gloo), {args.config.name}, blocks of {args.block} steps")
    print(f"{'agreeing':<22}{'blocks':>8}{'ms/step':>10}{'steps/agreement':>18}")
    median = {}
    for name in CADENCES:
        mine = [b for b in blocks if b["cadence"] == name]
        median[name] = statistics.median(b["seconds_per_step"] for b in mine)
        per = args.block * len(mine) / max(1, sum(b["agreements"] for b in mine))
        print(f"{name:<22}{len(mine):>8}{1000 * median[name]:>10.2f}{per:>18.1f}")
    every, shipped = median["every step"], median["about once a second"]
    print(f"time per step, about once a second / every step: {shipped / every:.3f}")


if __name__ == "__main__":
    main()
