"""Lightning's training step (`TinyLM` in a `lightning.Trainer`) vs a plain PyTorch loop doing the same work.

One process, one seed: both sides get the same GPT init, the same AdamW parameter groups and betas, the same LR
values (`tinylm.train.schedules.lr_at`), clipping at the config's `gradient_clip_val`, and the same batches in the same
order (each iterates its own `ResumableLoader` from the same `TinyLMDataModule`). The script checks that the
per-step losses agree, then times both. The two sides run interleaved in blocks (Lightning block, plain block,
Lightning block, ...: a callback runs the plain block between Lightning steps), so load from other jobs on a
shared machine hits both alike.

Per step it reports two times, as medians over the steps after warm-up:
- step: Lightning's on_train_batch_start -> on_train_batch_end (forward, loss, backward, clip, AdamW step, LR
  scheduler, `self.log` calls); in the plain loop the same span (batch already fetched -> after zero_grad).
- loop: start of one step to the start of the next, which adds fetching the batch and, for Lightning,
  everything the Trainer does between batches (logger connector, callbacks, progress tracking).

Passes: `bare` (no progress bar, logger or checkpointing), `callbacks` (tinylm's SpeedMonitor, HealthMonitor,
RNGState and the CSV logger, as `tinylm fit` adds them), `full` (additionally the progress bar and checkpoint
callbacks of `tinylm fit`; the bar writes to stderr).

On a GPU (`--device cuda`) kernels run asynchronously, so a step's host span says nothing: each side is timed per
block (device synchronised at the block's start and end, nothing in between), and its step time is the block's wall
time over its steps. Both sides run the recipe's precision (`--precision`, default bf16-mixed on CUDA),
`torch.compile` when `--compile` (both sides), fused AdamW, and read their losses once per block. The report adds
tokens/s and MFU (model FLOPs of `GPT.flops_per_token`, against the datasheet peak and a bf16 matmul measured here).

    python benchmarks/bench_train_step.py                          # laptop recipe, bare + callbacks
    python benchmarks/bench_train_step.py --steps 300 --passes bare,callbacks,full --threads 1
    python benchmarks/bench_train_step.py --device cuda --compile --config configs/gpt2-124m.yaml \
        --corpus DATA/tinyshakespeare.txt --tokenizer tiktoken:DATA/gpt2.tiktoken --steps 30 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml

from tinylm.data import TinyLMDataModule
from tinylm.model import GPT
from tinylm.train.module import TinyLM, token_loss
from tinylm.train.optim import fused_adamw
from tinylm.train.schedules import lr_at

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "shakespeare-char-cpu.yaml"
PASSES = ("bare", "callbacks", "full")
DEFAULT_DATA = REPO.parent / "shared" / "data"  # the shared read-only data folder beside the repo


# ------------------------------------------------------------------------------------------------ setup
def load_recipe(config: Path) -> dict[str, Any]:
    """The config's seed, model, data and trainer sections (what a benchmark needs to rebuild the run)."""
    cfg = yaml.safe_load(Path(config).read_text())
    return {
        "seed": int(cfg.get("seed_everything", 1337)),
        "model": dict(cfg.get("model") or {}),
        "data": dict(cfg.get("data") or {}),
        "trainer": dict(cfg.get("trainer") or {}),
    }


def make_datamodule(recipe: dict[str, Any], data_dir: Path, cache_dir: Path, *, val_batches: int = 1,
                    corpus: Path | None = None, tokenizer: str | None = None) -> TinyLMDataModule:
    """The recipe's data module on a local corpus (default: the tinyshakespeare copy in `data_dir`; no download),
    prepared in `cache_dir`; `tokenizer` overrides the recipe's (e.g. a local `tiktoken:PATH` for gpt2)."""
    corpus = Path(corpus) if corpus else Path(data_dir) / "tinyshakespeare.txt"
    if not corpus.is_file():
        raise FileNotFoundError(f"{corpus} not found; pass --data DIR (the folder holding tinyshakespeare.txt) or "
                                "--corpus FILE")
    d = recipe["data"]
    dm = TinyLMDataModule(corpus=str(corpus), tokenizer=tokenizer or d.get("tokenizer", "char"),
                          vocab_size=int(d.get("vocab_size", 8192)), block_size=d["block_size"],
                          batch_size=d["batch_size"], cache_dir=str(cache_dir), seed=recipe["seed"],
                          val_batches=val_batches)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def make_module(recipe: dict[str, Any], dm: TinyLMDataModule, **overrides: Any) -> TinyLM:
    """`TinyLM` as `tinylm fit` builds it, seeded first; the schedule's length is the recipe's max_steps."""
    model_cfg = {**recipe["model"], "compile_model": False, **overrides}
    L.seed_everything(recipe["seed"], verbose=False)
    return TinyLM(vocab_size=dm.vocab_size, block_size=dm.block_size, eos_id=dm.eos_id,
                  decay_steps=recipe["trainer"]["max_steps"], **model_cfg)


def quiet_lightning() -> None:
    """Silence Lightning's per-fit banners and the warnings that do not apply to a benchmark."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "tinylm"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*`max_epochs` was not set.*")


def machine_line() -> str:
    """CPU model, cores, torch/lightning versions and the current load (the machine may be shared)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "load average unknown"
    return (f"{model}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), lightning {L.__version__}, {load}")


# ------------------------------------------------------------------------------------------------ clocks
@dataclass
class Clock:
    """Per-step timestamps of one side. `block_end[i]` marks a step after which the other side ran a block."""

    starts: list[float] = field(default_factory=list)  # perf_counter at the start of each step
    steps: list[float] = field(default_factory=list)  # seconds of each step's timed span
    cpu_start: float = 0.0
    block_start: float = 0.0
    cpu_steps: list[float] = field(default_factory=list)  # CPU seconds (all threads of the process) of that span
    losses: list[float] = field(default_factory=list)
    block_end: set[int] = field(default_factory=set)

    def loop_times(self, warmup: int) -> list[float]:
        """Start-to-start intervals, leaving out the ones that contain the other side's block."""
        return [self.starts[i] - self.starts[i - 1] for i in range(max(1, warmup + 1), len(self.starts))
                if i - 1 not in self.block_end]

    def end_block(self, seconds: float, cpu_seconds: float, n: int) -> None:
        """GPU timing: a block of `n` steps took `seconds` (device synchronised at both ends): each step its share."""
        self.steps += [seconds / n] * n
        self.cpu_steps += [cpu_seconds / n] * n

    def block_medians(self, warmup: int, block: int) -> list[float]:
        """Median step time of each block after warm-up (for ratios of neighbouring blocks)."""
        return [statistics.median(self.steps[j:j + block]) for j in range(0, len(self.steps), block)
                if j >= warmup and len(self.steps[j:j + block]) == block]


class StepStart(L.Callback):
    """Put first in the callback list: stamps the start of each training step (on a GPU: of each block, after a
    device sync)."""

    def __init__(self, clock: Clock, block: int = 0) -> None:
        self.clock, self.block = clock, block  # block > 0: GPU timing per block
        self.n = 0  # steps started (batch_idx restarts each epoch: a small corpus has short ones)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.n += 1
        if self.block and (self.n - 1) % self.block == 0:
            torch.cuda.synchronize()
            self.clock.block_start, self.clock.cpu_start = time.perf_counter(), time.process_time()
        self.clock.starts.append(time.perf_counter())
        if not self.block:
            self.clock.cpu_start = time.process_time()


class StepEnd(L.Callback):
    """Put after tinylm's callbacks: stamps the end of each step and reads its loss (outside the timed span); on a
    GPU, the end of each block (device synchronised), where the block's losses are read."""

    def __init__(self, clock: Clock, block: int = 0) -> None:
        self.clock, self.block, self._losses = clock, block, []
        self.n = 0  # steps ended

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self.block:
            self.clock.steps.append(time.perf_counter() - self.clock.starts[-1])
            self.clock.cpu_steps.append(time.process_time() - self.clock.cpu_start)
            self.clock.losses.append(float(outputs["loss"]))
            return
        self.n += 1
        self._losses.append(outputs["loss"].detach())
        if self.n % self.block == 0:
            torch.cuda.synchronize()
            self.clock.end_block(time.perf_counter() - self.clock.block_start,
                                 time.process_time() - self.clock.cpu_start, self.block)
            self.clock.losses += torch.stack(self._losses).float().tolist()
            self._losses = []


# ------------------------------------------------------------------------------------------------ plain loop
class PlainLoop:
    """The same training as `TinyLM` under a Trainer, in plain PyTorch, `block` steps at a time."""

    def __init__(self, lit: TinyLM, dm: TinyLMDataModule, *, seed: int, clip: float,
                 device: torch.device | None = None, precision: str = "32-true", compile: bool = False,
                 eager_loss: bool = False) -> None:
        hp = lit.hparams
        self.device = device = device or torch.device("cpu")
        self.model = _same_init_gpt(lit, seed).to(device)
        self.loss_fn = token_loss
        if compile:  # as TinyLM does: the model compiled in place, and the model + loss as one graph
            self.model.compile()
            if not eager_loss:  # else the loss runs eagerly on the compiled model's logits (tinylm before 2026-11-27)
                self.loss_fn = torch.compile(token_loss)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), fused=fused_adamw(device))
        self.schedule = {"schedule": hp.lr_schedule, "lr": hp.lr, "min_lr": hp.min_lr, "warmup_steps": hp.warmup_steps,
                             "decay_steps": hp.decay_steps, "decay_fraction": hp.decay_fraction}
        self.clip = clip
        self.batches = _epochs(dm.train_dataloader())  # its own loader: batch k is the same windows as Lightning's k
        self.step = 0
        self.clock = Clock()

    def run(self, n: int) -> None:
        gpu = self.device.type == "cuda"
        if gpu:
            torch.cuda.synchronize()
            b0, bc0 = time.perf_counter(), time.process_time()
        losses = []
        for _ in range(n):
            self.clock.starts.append(time.perf_counter())
            x, y = next(self.batches)  # (B, T), (B, T)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            t0, c0 = time.perf_counter(), time.process_time()
            lr = lr_at(self.step, **self.schedule)
            for group in self.opt.param_groups:
                group["lr"] = lr
            with self.autocast:
                loss = self.loss_fn(self.model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if not gpu:
                self.clock.steps.append(time.perf_counter() - t0)
                self.clock.cpu_steps.append(time.process_time() - c0)
            losses.append(loss.detach())
            self.step += 1
        if gpu:
            torch.cuda.synchronize()
            self.clock.end_block(time.perf_counter() - b0, time.process_time() - bc0, n)
        self.clock.losses += torch.stack(losses).float().tolist()
        self.clock.block_end.add(self.step - 1)


def _epochs(loader: Any) -> Any:
    """The loader's batches epoch after epoch, as Lightning iterates it (a StopIteration raised inside a Lightning
    callback ends Lightning's epoch without a word: the plain side then stopped running on small corpora)."""
    while True:
        yield from loader


def _same_init_gpt(lit: TinyLM, seed: int) -> GPT:
    """A GPT built like `lit.model` from the same seed; checked to be bit-identical before any step."""
    torch.manual_seed(seed)
    model = GPT(lit.model.config)
    for (name, a), (_, b) in zip(lit.model.state_dict().items(), model.state_dict().items()):
        if not torch.equal(a, b):
            raise AssertionError(f"initial weights differ at {name}: the two sides do not start from the same model")
    return model


class Interleave(L.Callback):
    """After every `block` Lightning steps, runs `block` plain steps (outside Lightning's timed span)."""

    def __init__(self, plain: PlainLoop, clock: Clock, block: int) -> None:
        self.plain, self.clock, self.block = plain, clock, block
        self.n = 0  # steps ended (batch_idx restarts each epoch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.n += 1
        if self.n % self.block == 0:
            self.clock.block_end.add(self.n - 1)
            with torch.enable_grad():
                self.plain.run(self.block)


# ------------------------------------------------------------------------------------------------ one pass
def run_pass(kind: str, recipe: dict[str, Any], data_dir: Path, tmp: Path, *, steps: int, warmup: int,
             block: int, device: str = "cpu", precision: str = "32-true", compile: bool = False,
             corpus: Path | None = None, tokenizer: str | None = None, eager_loss: bool = False
             ) -> tuple[Clock, PlainLoop, TinyLM]:
    """Fit Lightning for warmup + steps with the plain loop interleaved; return (lightning, plain) clocks."""
    from tinylm.train.callbacks import (
        PeriodicCheckpoint,
        ProgressBar,
        RNGState,
        SpeedMonitor,
    )
    from tinylm.train.health import HealthMonitor
    from tinylm.train.loggers import RunCSVLogger

    if kind not in PASSES:
        raise ValueError(f"unknown pass {kind!r}; choose from {', '.join(PASSES)}")
    total = -(-(warmup + steps) // block) * block  # whole blocks, so both sides run the same number of steps
    dm = make_datamodule(recipe, data_dir, tmp / "cache", corpus=corpus, tokenizer=tokenizer)
    lit = make_module(recipe, dm, dropout=0.0, compile_model=compile)  # dropout draws on the global RNG (shared)
    clip = float(recipe["trainer"].get("gradient_clip_val") or 1.0)
    plain = PlainLoop(lit, dm, seed=recipe["seed"], clip=clip, device=torch.device(device), precision=precision,
                      compile=compile, eager_loss=eager_loss)
    sync_block = block if device == "cuda" else 0
    clock = Clock()
    tinylm_callbacks: list[L.Callback] = []
    logger: Any = False
    extra: dict[str, Any] = {}
    if kind in ("callbacks", "full"):
        tinylm_callbacks = [SpeedMonitor(), RNGState(), HealthMonitor()]
        logger = RunCSVLogger(tmp / f"run-{kind}")
        extra["log_every_n_steps"] = int(recipe["trainer"].get("log_every_n_steps", 50))
    if kind == "full":
        from lightning.pytorch.callbacks import ModelCheckpoint

        from tinylm.train.checkpoint_io import AtomicCheckpointIO

        ckpt_dir = tmp / f"run-{kind}" / "checkpoints"
        tinylm_callbacks = [
            ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                            auto_insert_metric_name=False, enable_version_counter=False),
            PeriodicCheckpoint(dirpath=ckpt_dir, filename="step-{step}", every_n_train_steps=500, save_top_k=3,
                               monitor="step", mode="max", save_last=True, auto_insert_metric_name=False,
                               enable_version_counter=False),
            *tinylm_callbacks, ProgressBar(),
        ]
        extra["plugins"] = [AtomicCheckpointIO()]
    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu", devices=1, precision=precision, max_steps=total,
        max_epochs=None,
        check_val_every_n_epoch=None, limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
        gradient_clip_val=clip, logger=logger, enable_checkpointing=kind == "full", enable_progress_bar=kind == "full",
        enable_model_summary=False, default_root_dir=str(tmp / f"run-{kind}"),
        callbacks=[StepStart(clock, sync_block), *tinylm_callbacks, StepEnd(clock, sync_block),
                   Interleave(plain, clock, block)], **extra,
    )
    trainer.fit(lit, datamodule=dm)
    if len(clock.steps) != total or len(plain.clock.steps) != total:
        raise AssertionError(f"expected {total} steps on each side, got {len(clock.steps)} (Lightning) and "
                             f"{len(plain.clock.steps)} (plain)")
    return clock, plain, lit


def summarize(kind: str, lit: Clock, plain: Clock, *, warmup: int, block: int) -> dict[str, float]:
    med = statistics.median
    pairs = [a / b for a, b in zip(lit.block_medians(warmup, block), plain.block_medians(warmup, block))]
    return {
        "pass": kind,
        "steps": len(lit.steps) - warmup,
        "lit_step": med(lit.steps[warmup:]),
        "plain_step": med(plain.steps[warmup:]),
        "lit_cpu": med(lit.cpu_steps[warmup:]),
        "plain_cpu": med(plain.cpu_steps[warmup:]),
        "lit_loop": med(lit.loop_times(warmup)),
        "plain_loop": med(plain.loop_times(warmup)),
        "paired": med(pairs) if pairs else float("nan"),
    }


def matmul_tflops(n: int = 8192, reps: int = 20) -> float:
    """bf16 n x n x n matrix products on random data, timed with CUDA events after warm-up: TFLOP/s."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12


def profile_steps(plain: PlainLoop, steps: int = 3, top: int = 15) -> str:
    """torch.profiler table of `steps` plain-loop steps: the kernels and ops that take the GPU's time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, torch.enable_grad():
        plain.run(steps)
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="recipe whose model/data shapes to use")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding tinyshakespeare.txt")
    parser.add_argument("--corpus", type=Path, default=None, help="text file to train on (default: DATA's "
                        "tinyshakespeare.txt)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: the recipe's), e.g. "
                        "tiktoken:PATH/gpt2.tiktoken where the machine is offline")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both sides train")
    parser.add_argument("--precision", default=None, help="Lightning precision for both sides (default: 32-true "
                        "on the CPU, bf16-mixed on CUDA)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model on both sides")
    parser.add_argument("--plain-eager-loss", action="store_true", help="with --compile: the plain side runs the "
                        "loss eagerly on the compiled model's logits, as tinylm did before it compiled the model and "
                        "the loss as one graph (the ratio then shows that graph's gain)")
    parser.add_argument("--batch-size", type=int, default=0, help="override the recipe's micro-batch size")
    parser.add_argument("--steps", type=int, default=150, help="timed steps per side and pass (after warm-up)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per side at the start of each pass")
    parser.add_argument("--block", type=int, default=10, help="steps each side runs before the other takes over")
    parser.add_argument("--passes", default="bare,callbacks", help="comma-separated: bare, callbacks, full")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--show-losses", type=int, default=10, help="print the first N losses of both sides")
    parser.add_argument("--profile", action="store_true", help="CUDA: print a torch.profiler table of 3 plain steps")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    precision = args.precision or ("bf16-mixed" if args.device == "cuda" else "32-true")
    if args.warmup % args.block and args.device == "cuda":
        raise SystemExit(f"--warmup {args.warmup} must be a multiple of --block {args.block} on CUDA (timed per block)")
    quiet_lightning()
    recipe = load_recipe(args.config)
    if args.batch_size:
        recipe["data"]["batch_size"] = args.batch_size
    m, d = recipe["model"], recipe["data"]
    print(f"machine: {machine_line()}", flush=True)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    if gpu:
        print(f"GPU: {gpu}, CUDA {torch.version.cuda}")
    print(f"model: {args.config.name}: n_layer {m['n_layer']}, n_head {m['n_head']}, n_embd {m['n_embd']}, "
          f"bias {m.get('bias')}, block {d['block_size']}, batch {d['batch_size']}, precision {precision}, "
          f"compile {args.compile}{' (plain side: loss outside the graph)' if args.plain_eager_loss else ''}, "
          f"device {args.device}; "
          f"{args.warmup} warm-up + {args.steps} timed steps per side, interleaved in blocks of {args.block}\n")
    rows, result = [], {"machine": machine_line(), "gpu": gpu, "config": args.config.name, "precision": precision,
                        "compile": args.compile, "plain_eager_loss": args.plain_eager_loss,
                        "batch_size": d["batch_size"], "block_size": d["block_size"]}
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(args.passes.split(",")):
            lit, plain_loop, module = run_pass(kind, recipe, args.data, Path(tmp), steps=args.steps,
                                               warmup=args.warmup, block=args.block, device=args.device,
                                               precision=precision, compile=args.compile, corpus=args.corpus,
                                               tokenizer=args.tokenizer, eager_loss=args.plain_eager_loss)
            plain = plain_loop.clock
            diffs = [abs(a - b) for a, b in zip(lit.losses, plain.losses)]
            n = min(args.show_losses, len(diffs))
            if i == 0 and n > 0:
                print(f"first {n} losses ({kind} pass):\n| step | Lightning | plain loop | abs diff |\n"
                      "|---:|---:|---:|---:|")
                for s in range(n):
                    print(f"| {s} | {lit.losses[s]:.7f} | {plain.losses[s]:.7f} | {diffs[s]:.1e} |")
            print(f"{kind}: max |loss diff| first {min(10, len(diffs))} steps {max(diffs[:10]):.2e}, "
                  f"all {len(diffs)} steps {max(diffs):.2e}")
            row = summarize(kind, lit, plain, warmup=args.warmup, block=args.block)
            row["max_loss_diff"] = max(diffs)
            row["params"] = module.model.num_params()
            row["flops_per_token"] = module.model.flops_per_token()
            row["tokens_per_step"] = d["batch_size"] * d["block_size"]
            rows.append(row)
            if args.profile and args.device == "cuda" and i == len(args.passes.split(",")) - 1:
                result["profile"] = profile_steps(plain_loop)
    print("\nmedians in ms; ratio = Lightning / plain" + (" (GPU: per block, device synchronised at its ends)"
                                                           if gpu else ""))
    print("| pass | timed steps | step: Lightning | step: plain | ratio | paired-block ratio "
          "| step CPU time: Lightning | plain | ratio | loop: Lightning | loop: plain | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pass']} | {r['steps']} | {r['lit_step'] * 1e3:.2f} | {r['plain_step'] * 1e3:.2f} | "
              f"{r['lit_step'] / r['plain_step']:.3f} | {r['paired']:.3f} | {r['lit_cpu'] * 1e3:.2f} | "
              f"{r['plain_cpu'] * 1e3:.2f} | {r['lit_cpu'] / r['plain_cpu']:.3f} | {r['lit_loop'] * 1e3:.2f} | "
              f"{r['plain_loop'] * 1e3:.2f} | {r['lit_loop'] / r['plain_loop']:.3f} |")
    if gpu:
        from tinylm.device import peak_flops_by_name

        datasheet = peak_flops_by_name(gpu, precision)
        measured = matmul_tflops() * 1e12 if "16" in precision else None
        result.update(datasheet_peak=datasheet, matmul_peak=measured)
        print(f"\npeaks: datasheet {datasheet / 1e12 if datasheet else float('nan'):.0f} TFLOP/s, measured bf16 "
              f"matmul {measured / 1e12 if measured else float('nan'):.0f} TFLOP/s")
        print("| pass | side | tokens/s | TFLOP/s | MFU (datasheet) | MFU (measured matmul) | peak memory GiB |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in rows:
            for side in ("lit", "plain"):
                tps = r["tokens_per_step"] / r[f"{side}_step"]
                flops = tps * r["flops_per_token"]
                r[f"{side}_tokens_per_sec"], r[f"{side}_tflops"] = tps, flops / 1e12
                r[f"{side}_mfu"] = flops / datasheet if datasheet else None
                r[f"{side}_mfu_measured"] = flops / measured if measured else None
                print(f"| {r['pass']} | {'Lightning' if side == 'lit' else 'plain'} | {tps:,.0f} | "
                      f"{flops / 1e12:.1f} | {r[f'{side}_mfu'] or float('nan'):.1%} | "
                      f"{r[f'{side}_mfu_measured'] or float('nan'):.1%} | |")
        result["max_memory_allocated_both_sides"] = torch.cuda.max_memory_allocated()
        print(f"peak memory (both sides' models, optimizers and activations together): "
              f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        if "profile" in result:
            print("\nprofile of 3 plain-loop steps (by CUDA time):\n" + result["profile"])
    result["rows"] = rows
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    print(f"\nafter: {machine_line()}")


if __name__ == "__main__":
    main()
