"""The stability guard's cost (`--guard.*`, tinylm.train.guard): the laptop recipe's training step with the guard on
vs off, and the guard's own time inside the step.

Both sides are `TinyLM` in a `lightning.Trainer` with the callbacks `tinylm fit` adds that touch every step
(SpeedMonitor, HealthMonitor, RNGState, the CSV logger every `log_every_n_steps`), the recipe's clipping and fused
AdamW, the same seed and batches. They run interleaved: round after round, a short fit with the guard off and one
with it on (the order alternating), so load from other jobs on a shared machine hits both alike. Reported, as
medians over the steps after each fit's warm-up:
- step: on_train_batch_start -> on_train_batch_end (forward, backward, clip, the guard's judgement, AdamW step);
- guard: the time inside the guard itself (its per-step judgement, timed around the call, and its host read on
  logging steps, spread over the steps), measured in the guard-on fits: the cost that the noise of a shared
  machine's step times cannot resolve to 1 %.

    python benchmarks/bench_guard.py                      # laptop recipe, 6 rounds of 60 steps a side
    python benchmarks/bench_guard.py --rounds 10 --steps 100 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import (  # noqa: E402 (the benchmarks folder is no package)
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

from tinylm.train.callbacks import RNGState, SpeedMonitor  # noqa: E402
from tinylm.train.guard import StabilityGuard  # noqa: E402
from tinylm.train.health import HealthMonitor  # noqa: E402
from tinylm.train.loggers import RunCSVLogger  # noqa: E402


class TimedGuard(StabilityGuard):
    """The guard, with the time of its per-step judgement and of its host read (logging steps) summed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seconds, self.calls = 0.0, 0

    def judge(self, pl_module, optimizer, norm) -> None:
        t = time.perf_counter()
        super().judge(pl_module, optimizer, norm)
        self.seconds += time.perf_counter() - t
        self.calls += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        t = time.perf_counter()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.seconds += time.perf_counter() - t


def one_fit(recipe, dm, steps: int, guard: bool, log_dir: Path) -> tuple[Clock, TimedGuard | None]:
    clock = Clock()
    timed = TimedGuard() if guard else None
    callbacks = [StepStart(clock), SpeedMonitor(), HealthMonitor(), RNGState(), *([timed] if timed else []),
                 StepEnd(clock)]
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, max_epochs=None, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, log_every_n_steps=recipe["trainer"].get("log_every_n_steps", 10),
                        gradient_clip_val=recipe["trainer"].get("gradient_clip_val"), precision="32-true",
                        logger=RunCSVLogger(log_dir), callbacks=callbacks,
                        use_distributed_sampler=False)
    trainer.fit(make_module(recipe, dm), dm)
    return clock, timed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the folder holding tinyshakespeare.txt")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per fit")
    p.add_argument("--warmup", type=int, default=10, help="steps of each fit left out of the medians")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_lightning()
    recipe = load_recipe(args.config)
    times: dict[bool, list[float]] = {False: [], True: []}
    ratios, guard_seconds, guard_steps = [], 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        dm = make_datamodule(recipe, args.data, Path(tmp) / "cache")
        for r in range(args.rounds):
            medians = {}
            for guard in ((False, True) if r % 2 == 0 else (True, False)):
                clock, timed = one_fit(recipe, dm, args.steps, guard, Path(tmp) / f"logs-{r}-{guard}")
                kept = clock.steps[args.warmup:]
                times[guard] += kept
                medians[guard] = statistics.median(kept)
                if timed is not None:
                    guard_seconds, guard_steps = guard_seconds + timed.seconds, guard_steps + timed.calls
            ratios.append(medians[True] / medians[False])
            print(f"round {r}: off {medians[False] * 1e3:.2f} ms, on {medians[True] * 1e3:.2f} ms "
                  f"(on/off {ratios[-1]:.3f})", flush=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    own = guard_seconds / max(guard_steps, 1)
    print(f"\n{machine_line()}")
    print(f"recipe {args.config.name}: {args.rounds} rounds x {args.steps} steps a side, medians after "
          f"{args.warmup} warm-up steps of each fit")
    print(f"step, guard off: {off * 1e3:.2f} ms   on: {on * 1e3:.2f} ms   on/off {on / off:.3f} "
          f"(median of the rounds' ratios {statistics.median(ratios):.3f})")
    print(f"the guard's own time: {own * 1e6:.0f} us per step = {own / off:.2%} of a step")


if __name__ == "__main__":
    main()
