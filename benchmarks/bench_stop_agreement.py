"""What the ranks' stop vote costs under DDP: a blocking all-reduce at every step vs one read a step later.

Under several ranks, `InterruptStop` makes every rank stop at the same step after a SIGTERM or Ctrl+C (one rank may
have missed the signal), so the ranks vote at every optimizer step's end. tinylm's vote is an all-reduce on CPU
tensors over a gloo group, started at one step's end and read at the next (`_stop_signal`); the baseline is the
blocking vote through the strategy (`trainer.strategy.reduce`, what tinylm did before, and still does where
torch.distributed has no group). This benchmark runs one real `tinylm fit` on 2 CPU ranks (DDP, gloo) and switches
between the two every ``--block`` optimizer steps: the same processes, model and data, so load from other jobs hits
both alike. It reports the median time per step of each kind of block (the first blocks are warm-up).

    python benchmarks/bench_stop_agreement.py                           # laptop recipe's model, 2 ranks
    python benchmarks/bench_stop_agreement.py --blocks 16 --n_layer 2 --n_embd 64
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

from tinylm.train.interrupt import InterruptStop

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "shakespeare-char-cpu.yaml"
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
VOTES = ("blocking, every step", "read a step later")


class Alternate(L.Callback):
    """Switches `InterruptStop`'s vote between blocking and read-a-step-later every ``block`` optimizer steps; rank 0
    writes the blocks' timings to ``$BENCH_OUT``."""

    def __init__(self, block: int = 40) -> None:
        self.block, self.blocks, self.started, self.group = block, [], None, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.block:
            return
        now = time.perf_counter()
        stop = next(c for c in trainer.callbacks if isinstance(c, InterruptStop))
        self.group = self.group or stop._votes
        if self.started is not None:
            self.blocks[-1]["seconds_per_step"] = (now - self.started) / self.block
        name = VOTES[(step // self.block) % 2]
        stop._collect()  # (this hook runs before the stop callback's, on every rank)
        stop._votes = self.group if name == VOTES[1] else None  # None: the strategy's blocking reduce
        self.blocks.append({"vote": name, "first_step": step})
        self.started = now

    def on_train_end(self, trainer, pl_module) -> None:
        next(c for c in trainer.callbacks if isinstance(c, InterruptStop))._votes = self.group  # to be released
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
               "--samples.every_n_steps", "0", "--model.warmup_steps", "10",
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
    print(f"{'stop vote':<24}{'blocks':>8}{'ms/step':>10}")
    median = {}
    for name in VOTES:
        mine = [b["seconds_per_step"] for b in blocks if b["vote"] == name]
        median[name] = statistics.median(mine)
        print(f"{name:<24}{len(mine):>8}{1000 * median[name]:>10.2f}")
    print(f"time per step, read a step later / blocking: {median[VOTES[1]] / median[VOTES[0]]:.3f}")


if __name__ == "__main__":
    main()
