"""`tinylm fit` and `tinylm validate`: LightningCLI over `TinyLM` and `TinyLMDataModule`, with tinylm's run folders.

A run lives in ``<trainer.default_root_dir>/<run.name>/`` (default ``runs/NAME``):
    config.yaml                 the config that started the run (a resume adds config.resume-step<N>[-2, -3...].yaml)
                                (a config.yaml found in the folder before the run is kept as config.previous.yaml)
    checkpoints/                best.ckpt, last.ckpt, step-<N>.ckpt
    csv/metrics.csv             every logged metric, one file continued across resumes
    samples.txt, wandb/         text samples; the W&B run (offline when there are no credentials)
    validate/metrics.csv        one row per `tinylm validate` of one of this run's checkpoints
A fresh `fit` refuses a folder that already holds a run: continue it with `--ckpt_path last`, or pick a new
`--run.name`. Nothing a run wrote is ever overwritten by another run.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import functools
import inspect
import json
import logging
import math
import multiprocessing
import os
import re
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from tinylm.checkpoint import checkpoints_by_step
from tinylm.errors import TinyLMError

log = logging.getLogger("tinylm")


@dataclass
class RunOptions:
    """Where a run lives and what it logs.

    Args:
        name: Run name: the run folder is ``<trainer.default_root_dir>/<name>`` and W&B shows this name.
        wandb_project: W&B project to log to; null disables W&B (the CSV log is always written).
        checkpoint_every: Save ``step-N.ckpt`` and ``last.ckpt`` every this many optimizer steps
            (and always at the end of training).
        keep_checkpoints: How many periodic ``step-N.ckpt`` files to keep (-1 keeps all).
    """

    name: str = "tinylm"
    wandb_project: str | None = "tinylm"
    checkpoint_every: int = 500
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        _check_run_name(self.name)
        if self.checkpoint_every < 1:
            raise ValueError(f"run.checkpoint_every must be >= 1 optimizer steps, got {self.checkpoint_every}")
        if self.keep_checkpoints < -1:
            raise ValueError(f"run.keep_checkpoints must be -1 (keep all) or >= 0, got {self.keep_checkpoints}")


RUNS_ROOT = "runs"  # trainer.default_root_dir's default: the folder holding all runs

# Trainer options that must be positive / non-negative numbers when set (a bad value otherwise fails deep inside
# Lightning, e.g. accumulate_grad_batches 0 -> ZeroDivisionError).
_POSITIVE = ("accumulate_grad_batches", "log_every_n_steps", "val_check_interval",
             "check_val_every_n_epoch", "num_nodes")
_NON_NEGATIVE = ("gradient_clip_val", "limit_val_batches", "limit_train_batches")


def _check_run_name(name: str) -> None:
    if not name or Path(name).name != name or name in (".", ".."):
        why = "empty" if not name else "not a folder of its own" if name in (".", "..") else "has a '/'"
        raise ValueError(f"run.name must be a plain folder name (runs/NAME), got {name!r} ({why}); pick another, "
                         "e.g. --run.name my-run")


def run_dir_of(root: str | Path | None, name: str) -> Path:
    _check_run_name(name)  # before anything is made: the data prepared, a folder runs/a for the name a/b
    return Path(root if root is not None else RUNS_ROOT) / name


def holds_run(run_dir: Path) -> bool:
    """Whether a folder holds another run's results (checkpoints or logged metrics)."""
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and any(ckpts.glob("*.ckpt")):
        return True
    metrics = run_dir / "csv" / "metrics.csv"
    return metrics.is_file() and metrics.stat().st_size > 0 and sum(1 for _ in open(metrics, "rb")) > 1


_LOCKS: dict[str, Any] = {}  # run folder -> the open lock file of this process


def _drop_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the run-folder lock files inherited from the parent. A child
    holding one kept the folder locked after the parent died (a worker outlives it by seconds), and the resume
    that followed was refused as "in use by another tinylm process"."""
    for f in _LOCKS.values():
        with contextlib.suppress(OSError):
            f.close()
    _LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def lock_run_folder(run_dir: Path):
    """An exclusive lock on ``<run dir>/.lock`` until `release_run_folders` (or the process's end, even by kill -9):
    two `tinylm fit` in one folder would interleave their logs and overwrite each other's checkpoints."""
    import fcntl

    key = str(run_dir.resolve())
    if key in _LOCKS:
        return _LOCKS[key]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError as e:  # under /proc: one line naming the folder (a file on the way, a read-only disk:
        # one_line names those)
        raise TinyLMError(f"cannot make the run folder {run_dir} ({e.strerror or e}); pick a writable "
                          "--trainer.default_root_dir DIR") from None
    f = open(run_dir / ".lock", "a+")  # noqa: SIM115 (held open, and locked, until the process ends)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise TinyLMError(f"{run_dir} is in use by another tinylm process ({holder}); wait for it to finish, or "
                          "use another --run.name") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    _LOCKS[key] = f
    return f


def release_run_folder(run_dir: Path) -> None:
    """Release this process's lock on ``run_dir`` (taken by `lock_run_folder`), if it holds one."""
    lock = _LOCKS.pop(str(run_dir.resolve()), None)
    if lock is not None:
        lock.close()


def _rank() -> int:
    """This process's global rank in a run (0 outside one)."""
    from lightning.pytorch.utilities import rank_zero_only

    return getattr(rank_zero_only, "rank", 0)


def _rank_zero() -> bool:
    return _rank() == 0


def release_run_folders() -> None:
    """Release this process's run-folder locks; a folder left holding nothing but its lock and empty folders (the
    run failed before writing anything: a config error, a corpus too short) is removed, so a typo leaves no empty
    run behind."""
    while _LOCKS:
        key, f = _LOCKS.popitem()
        folder = Path(key)
        inside = sorted(folder.rglob("*"), reverse=True) if folder.is_dir() else []  # deepest first
        lock = folder / ".lock"
        empty = lock in inside and all(p.is_dir() for p in inside if p != lock)  # no file but the lock
        if empty:
            lock.unlink()  # while still locked: no other process holds this file
        f.close()  # closing the file releases its flock
        if empty:
            with contextlib.suppress(OSError):  # another process came in meanwhile: the folder is theirs
                for sub in inside:
                    if sub.is_dir():
                        sub.rmdir()
                folder.rmdir()


def _named_options(argv: list) -> set[str]:
    """The options a command sets, even to their defaults (`--data.val_batches null` evaluates the whole split,
    not the checkpoint's setting): named on the command line (`--data.KEY`, `--data.KEY=V`), or keys of the
    `data`/`model`/`trainer` sections of a `--config` file or of a section given whole (`--data '{...}'`)."""
    import yaml

    named: set[str] = set()
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or not arg.startswith("-"):
            continue
        key, _, value = arg.lstrip("-").partition("=")
        key = "config" if key == "c" else key  # -c FILE, as --help lists it
        named.add(key)
        if not value and i + 1 < len(argv) and isinstance(argv[i + 1], str):
            value = argv[i + 1]
        if key in ("config", "data", "model", "trainer"):
            text = value
            with contextlib.suppress(OSError, ValueError):  # a file's name, or the section itself as YAML/JSON
                if Path(value).is_file():
                    text = Path(value).read_text(encoding="utf-8")
            try:
                loaded = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if isinstance(loaded, dict):
                sections = loaded if key == "config" else {key: loaded}
                named |= {f"{name}.{k}" for name, section in sections.items() if isinstance(section, dict)
                          for k in section}
    return named


def check_trainer_options(trainer_cfg: dict[str, Any], subcommand: str, *, runs: bool = True) -> None:
    """Range checks of the Trainer options that Lightning only trips over later (or never). `runs`: the command
    runs the config as configured, its strategy's processes and validations (plan, lr-find and scaling do not:
    `tinylm plan --trainer.strategy fsdp` plans the memory of a strategy that `fit` refuses)."""
    for key in _POSITIVE:
        value = trainer_cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"trainer.{key} must be > 0, got {value}")
    for key in _NON_NEGATIVE:
        value = trainer_cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"trainer.{key} must be >= 0, got {value}")
    _check_devices(trainer_cfg, runs)
    if trainer_cfg.get("barebones"):  # Lightning then refuses every logger, callback and checkpoint tinylm adds
        raise ValueError("trainer.barebones=true turns off logging, checkpoints and callbacks, and a tinylm run is "
                         "made of them (metrics.csv, last.ckpt, the health monitor); leave it out (for a bare speed "
                         "test: benchmarks/bench_train_step.py)")
    if runs:
        check_accelerator(trainer_cfg.get("accelerator"))
        _warn_more_ranks_than_cores(trainer_cfg)
    if subcommand == "fit":
        max_steps = trainer_cfg.get("max_steps", -1)
        if max_steps in (None, -1):  # Lightning's default: no config given, or one without it
            raise ValueError("trainer.max_steps is not set (tinylm runs are driven by steps): pass --config "
                             "configs/NAME.yaml (a recipe), or --trainer.max_steps N")
        if max_steps <= 0:
            raise ValueError(f"trainer.max_steps must be > 0, got {max_steps}; tinylm runs are driven by steps")
        if trainer_cfg.get("overfit_batches") not in (None, 0, 0.0):
            raise ValueError(f"trainer.overfit_batches={trainer_cfg['overfit_batches']} is not supported by tinylm "
                             "(its loader draws windows by step and cannot be re-instantiated by Lightning); to "
                             "see a model overfit, train on a tiny corpus: --data.corpus FILE of a few hundred "
                             "characters")
        if trainer_cfg.get("limit_train_batches") in (0, 0.0):  # Lightning then ends the run at step 0 without a word
            raise ValueError("trainer.limit_train_batches=0 trains nothing (the run would end at step 0); leave it out: "
                             "tinylm runs are driven by --trainer.max_steps")
        if trainer_cfg.get("max_epochs") not in (None, -1):
            raise ValueError("trainer.max_epochs is not used by tinylm (runs are driven by trainer.max_steps; an "
                             "epoch is a notional pass over random windows): remove it and set --trainer.max_steps")
        if runs:
            _check_how_it_runs(trainer_cfg)


def check_accelerator(accelerator: Any) -> None:
    """A GPU (or TPU) accelerator named on a machine without one: one line naming what was found and the fix,
    not Lightning's "No supported gpu backend found!"."""
    import torch
    from lightning.pytorch.accelerators import AcceleratorRegistry

    if not isinstance(accelerator, str) or accelerator.lower() in ("auto", "cpu"):
        return  # an Accelerator object: Lightning checks it
    name = accelerator.lower()
    if name not in ("gpu", *AcceleratorRegistry.available_accelerators()):
        return  # a name Lightning refuses itself, with the list of names
    if any(AcceleratorRegistry[n]["accelerator"].is_available() for n in (("cuda", "mps") if name == "gpu" else (name,))):
        return
    what = {"gpu": "no CUDA GPU or Apple MPS device", "cuda": "no CUDA GPU", "mps": "no Apple MPS device"}
    build = " (this torch is a CPU-only build)" if name in ("gpu", "cuda") and torch.version.cuda is None else ""
    raise ValueError(f"trainer.accelerator {accelerator!r}: {what.get(name, f'no {name} device')} is available "
                     f"here{build}; leave the option out (auto uses what there is) or pass --trainer.accelerator cpu")


def _on_cpu(trainer_cfg: dict[str, Any]) -> bool:
    """Whether the run trains on the CPU: --trainer.accelerator cpu, or auto on a machine without a GPU."""
    import torch

    accelerator = str(trainer_cfg.get("accelerator") or "auto").lower()
    gpu = torch.cuda.is_available() or torch.backends.mps.is_available()
    return accelerator == "cpu" or accelerator == "auto" and not gpu


def _check_devices(trainer_cfg: dict[str, Any], runs: bool) -> None:
    """trainer.devices is a number of devices, -1 (every GPU), auto or a list of GPU indices; on the CPU (a run
    that `runs`), a number of processes. Lightning's CPU parser raised a bare TypeError ("`devices` selected with
    `CPUAccelerator` should be an int > 0.") with its traceback for `two`, -3, 1.5 or a list."""
    devices = trainer_cfg.get("devices")
    if devices is None:
        return
    text = str(devices).strip().lower()
    if isinstance(devices, (list, tuple)) or re.fullmatch(r"\d+ *(, *\d+ *)*,? *", text) and "," in text:  # "0,1"
        indices = list(devices) if isinstance(devices, (list, tuple)) else [int(d) for d in text.split(",") if d.strip()]
        if runs and _on_cpu(trainer_cfg):
            raise ValueError(f"trainer.devices {indices} lists GPU indices, and this run is on the CPU; pass "
                             f"the number of training processes instead: --trainer.devices {len(indices)}")
        return
    if text == "auto" or re.fullmatch(r"[1-9]\d*", text) or text == "-1" and not (runs and _on_cpu(trainer_cfg)):
        return
    shown = text if re.fullmatch(r"-?\d+", text) else repr(devices)
    raise ValueError(f"trainer.devices must be a number of devices (1 or more), auto, or -1 for every GPU, got "
                     f"{shown}; on the CPU it is the number of training processes (e.g. --trainer.devices 1)")


def _warn_more_ranks_than_cores(trainer_cfg: dict[str, Any]) -> None:
    """More CPU devices than cores: Lightning starts them all (`--trainer.devices 64` on 2 cores, 64 processes)
    without a word, though they only take turns on the cores."""
    devices = trainer_cfg.get("devices")
    if isinstance(devices, str) and devices.isdigit():
        devices = int(devices)
    if not isinstance(devices, int) or isinstance(devices, bool) or not _on_cpu(trainer_cfg):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if devices > cores:
        warnings.warn(f"--trainer.devices {devices} starts {devices} training processes on a CPU with {cores} "
                      f"cores: they take turns on the cores, so a step is no faster than on {cores} (each waits for "
                      "the slowest at every gradient all-reduce), and each holds its own model, optimizer and data "
                      f"loader in memory; use --trainer.devices {cores} or fewer (a larger --data.batch_size keeps "
                      "the global batch)")


def _check_how_it_runs(trainer_cfg: dict[str, Any]) -> None:
    """The strategy, nodes and validation interval of a run that trains as configured."""
    strategy = trainer_cfg.get("strategy") or trainer_cfg.get("strategy.class_path")  # a name, or a class
    start = strategy if isinstance(strategy, str) and "." not in strategy else \
        trainer_cfg.get("strategy.init_args.start_method")
    if isinstance(strategy, str) and any(k in strategy.lower() for k in ("fsdp", "modelparallel")):
        raise ValueError(f"trainer.strategy {strategy!r} is not supported by tinylm: FSDP hands the optimizer "
                         "flattened shards, so weight decay (chosen by a parameter's shape), Muon (whole "
                         "matrices) and gradient clipping (one shard's norm) would silently train another "
                         "model; use --trainer.strategy ddp (`tinylm plan --config ...` shows the memory a "
                         "device needs)")
    nodes = trainer_cfg.get("num_nodes")
    if isinstance(nodes, int) and nodes > 1 and not _cluster_found():
        raise ValueError(f"trainer.num_nodes {nodes} but no cluster was found (SLURM, torchrun, MPI, LSF) "
                         "and MASTER_ADDR is unset: this node would wait for the others forever; run "
                         "the same command on every node with MASTER_ADDR (node 0's address), MASTER_PORT and "
                         "NODE_RANK (0, 1, ...) set, or launch it with srun or torchrun")
    if isinstance(start, str) and "spawn" in start:
        raise ValueError(f"trainer.strategy {strategy!r} starts its processes by spawning, which pickles the "
                         "running trainer and model (tinylm's run holds open files); use --trainer.strategy ddp "
                         "(one process per device, each running the command: the same training)")
    every, accumulate = trainer_cfg.get("val_check_interval"), trainer_cfg.get("accumulate_grad_batches")
    if isinstance(every, float) and trainer_cfg.get("check_val_every_n_epoch") is None:  # Lightning needs it then
        raise ValueError(f"trainer.val_check_interval={every} is a fraction of an epoch, and tinylm's epochs are "
                         "notional (random windows, driven by max_steps); give a number of batches (e.g. "
                         "--trainer.val_check_interval 500) or a time (00:00:30:00)")
    whole = isinstance(every, int) and not isinstance(every, bool)  # batches; else a time
    if every is not None and isinstance(accumulate, int) and accumulate > 1 and \
            not (whole and every % accumulate == 0):  # a validation could fall between two micro-batches
        below = every - every % accumulate if whole else 0
        nearest = f"{below} or {below + accumulate}" if below else f"{accumulate} (or a multiple)"
        what = "(batches) is not a multiple of" if whole else "(a time) under"
        raise ValueError(f"trainer.val_check_interval={every} {what} "
                         f"trainer.accumulate_grad_batches={accumulate}: validation would run inside an "
                         f"optimizer step, and a best.ckpt saved there could not be resumed exactly (its "
                         f"accumulated gradients are not saved); use --trainer.val_check_interval {nearest}")


def _cluster_found() -> bool:
    """Whether this process was started by a cluster Lightning detects, or told by hand where the others are."""
    from lightning.fabric.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    if "MASTER_ADDR" in os.environ:  # Kubeflow's PyTorchJob sets it too (Lightning cannot detect Kubeflow)
        return True
    return any(env.detect() for env in (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment, MPIEnvironment))


class RunConfig(SaveConfigCallback):
    """Saves the parsed config as ``<run dir>/config.yaml`` on rank zero, never over another file: a resumed run
    writes ``config.resume-step<N>.yaml`` beside the original; a new run (or a branch) into a folder that holds a
    config.yaml of its own (the user's, or that of an attempt that stopped before it logged) moves that file to
    ``config.previous.yaml`` first, unless it is the config this run would write. A run from a checkpoint writes
    once the checkpoint is restored and training starts (a resume refused on restoring, e.g. for another batch
    size, leaves no record: a later resume's warnings compare with the newest record, which must be of a run that
    trained)."""

    def __init__(self, *args: Any, run_dir: Path, resume_step: int | None, continues: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, save_to_log_dir=False, **kwargs)
        self.run_dir, self.resume_step, self.continues = run_dir, resume_step, continues

    def setup(self, trainer, pl_module, stage: str) -> None:
        # a run from a checkpoint (a resume, or a branch into a new folder) writes at on_train_start: every rank
        # decides alike from the command line (a decision by what is on disk once hung DDP: a rank that looked after
        # rank zero wrote config.yaml skipped a broadcast), and a branch refused on restoring leaves no config.yaml
        if self.resume_step is None:
            super().setup(trainer, pl_module, stage)
        if multiprocessing.parent_process() is not None and "wandb" in sys.modules:  # a rank that ddp_fork started
            # it leaves by os._exit, past the atexit hook with which wandb ends its run: the run's file kept no
            # metric. Multiprocessing's own exit hooks do run (also after an error), and end it here.
            from multiprocessing.util import Finalize

            Finalize(None, _finish_forked_wandb, args=(trainer,), exitpriority=100)

    def on_train_start(self, trainer, pl_module) -> None:
        super().setup(trainer, pl_module, "fit")  # once: Lightning's setup returns if already saved
        data = trainer.datamodule
        if trainer.is_global_zero and data is not None:  # what an optimizer step is made of, devices included
            B, A, W, T = data.batch_size, trainer.accumulate_grad_batches, trainer.world_size, data.block_size
            step, max_steps = B * A * W * T, trainer.max_steps
            splits = [meta["splits"]["train"]["tokens"] for meta in data.metas]
            split = sum(splits)
            run = (f"; {max_steps:,} steps (trainer.max_steps) read {step * max_steps:,} tokens: "
                   f"{step * max_steps / split:.3g} passes over the training split ({split:,} tokens)"
                   if max_steps > 0 else "")
            # data.weights draw each corpus at its own pace (unset: in proportion to its tokens, all at one pace):
            # [0.1, 0.9] over 18,000 and 2,700 tokens read the small one 30 times as often as the 0.297 passes say
            weighted = len(splits) > 1 and data.weights is not None
            shares = [w / sum(data.weights) for w in data.weights] if weighted else [1.0]
            if weighted and max_steps > 0:
                run += " (by data.weights: " + ", ".join(
                    f"{name} {step * max_steps * share / n:.3g} passes of {n:,}"
                    for name, share, n in zip(data.val_names, shares, splits)) + ")"
            done = trainer.global_step  # a resume: what is left of the run, not only its whole
            if max_steps > 0 and 0 < done < max_steps:
                run += (f"; resumed at step {done:,}: {max_steps - done:,} steps left read "
                        f"{step * (max_steps - done):,} tokens")
            log.info("global batch: %s windows of %d tokens = data.batch_size %d x accumulate_grad_batches %d x %d "
                     "device(s): %s tokens per optimizer step%s", f"{B * A * W:,}", T, B, A, W, f"{step:,}", run)
            for name, share, n in zip(data.val_names, shares, splits if weighted else [split]):
                if step * share > n:  # windows drawn at random: each step reads the same text several times over
                    what = (f"{step * share:,.0f} tokens of {name} (its data.weights share {share:.3g}) but its "
                            f"training split holds {n:,}" if weighted else
                            f"{step:,} tokens but the training split holds {split:,}")
                    fix = "a smaller weight for it, " if weighted else ""
                    warnings.warn(f"one optimizer step reads {what}: every step goes over it {step * share / n:.3g} "
                                  f"times; use {fix}a smaller --data.batch_size (or accumulate_grad_batches, "
                                  f"block_size) or a larger corpus", UserWarning)

    def on_fit_end(self, trainer, pl_module) -> None:
        # said here, in the process that trained: under ddp_fork the command's own trainer stays at step 0
        t = trainer
        if t.is_global_zero and 0 < t.max_steps and t.global_step < t.max_steps:  # EarlyStopping is silent
            saved = "; last.ckpt is saved there: --ckpt_path last goes on" if t.checkpoint_callbacks else ""
            log.info("the run stopped at step %d of trainer.max_steps %d (--trainer.max_time, or a callback such as "
                     "EarlyStopping)%s", t.global_step, t.max_steps, saved)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        path = self.run_dir / "config.yaml"
        if self.continues and path.exists():
            path = _unused(self.run_dir / f"config.resume-step{self.resume_step}.yaml")  # resumed from this step
            # before (killed in between): that record is kept too
        elif os.path.lexists(path) and (path.is_symlink() or not path.is_file() or path.read_text(errors="replace")
                                        != self.parser.dump(self.config, skip_none=False)):
            # a link (dangling too) or a folder is moved aside like a file: written through, a link put the config
            # outside the run folder; read, a folder crashed the run
            kept = _unused(self.run_dir / "config.previous.yaml")
            path.rename(kept)
            log.warning("%s was not this run's config: kept as %s", path, kept.name)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.parser.save(self.config, path, skip_none=False, overwrite=True, multifile=self.multifile)
        # W&B has the model's and the data's hyperparameters (Lightning logs those); the rest of the run's settings
        # (max_steps, accumulate_grad_batches, precision, seed, ...) only the config holds
        wandb = [lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"]
        if wandb:
            config = json.loads(self.parser.dump(self.config, skip_none=False, format="json"))
            for logger in wandb:
                logger.log_hyperparams({k: v for k, v in config.items() if k not in ("model", "data")})


def _unused(path: Path) -> Path:
    """``path``, or the first of ``<stem>-2<suffix>``, ``-3``... that does not exist."""
    n, free = 1, path
    while os.path.lexists(free):  # a dangling link is taken too
        n += 1
        free = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return free


RUNTIME_OPTIONS = ("compile_model", "activation_checkpointing")
"""TinyLM options that a resume or validation takes from its own config, not the checkpoint: they change speed and
memory, never the numbers."""

_HELP = {
    "ckpt_path": "`last` (this run's newest checkpoint), `best` (its best.ckpt by val/loss) or the path of a .ckpt "
                 "written by `tinylm fit`: fit resumes from it, validate evaluates it",
    "verbose": "Show full tracebacks on errors (tinylm's flag, as for every command; the metrics are always "
               "printed)",
    "weights_only": "Not used: tinylm always loads checkpoints with weights_only=True (tensors and plain values, "
                    "never code)",
    "trainer.default_root_dir": "The folder of all runs: a run lives in DIR/<run.name>/",
    "trainer.precision": "32-true, bf16-mixed, 16-mixed, bf16-true, 64-true, ... Unset: bf16-mixed on GPUs "
                         "(16-mixed where bf16 is missing); on CPUs bf16-mixed for models at least 256 wide where "
                         "the CPU has native bf16, else 32-true",
    "trainer.max_steps": "Optimizer steps of the run (required: tinylm runs are driven by steps)",
    "trainer.max_epochs": "Refused by tinylm: runs are driven by --trainer.max_steps (an epoch is a notional pass "
                          "over random windows)",
    "trainer.min_epochs": "Not useful in tinylm: its epochs are notional; use --trainer.min_steps",
    "trainer.barebones": "Refused by tinylm: a run is made of the logging, checkpoints and callbacks it turns off",
    "trainer.overfit_batches": "Refused by tinylm (its loader draws windows by step); to see a model overfit, train "
                               "on a tiny corpus",
    "trainer.val_check_interval": "Validate every this many batches (micro-batches: a multiple of "
                                  "accumulate_grad_batches) or after this much time (DD:HH:MM:SS); a fraction of "
                                  "an epoch only with --trainer.check_val_every_n_epoch (tinylm's epochs are "
                                  "notional)",
    "trainer.check_val_every_n_epoch": "Validate every N notional epochs (an epoch: the train split's tokens / "
                                       "(batch_size x block_size) batches); unset (tinylm's default): validation "
                                       "follows --trainer.val_check_interval alone",
    "trainer.logger": "Loggers added to tinylm's own (a CSV in the run folder, W&B when run.wandb_project is set), "
                      "e.g. lightning.pytorch.loggers.TensorBoardLogger; false turns all logging off",
}
"""Help texts of Trainer options whose Lightning docstring says other than what they do in tinylm."""


class TinyLMCLI(LightningCLI):
    """LightningCLI with tinylm's run folders, loggers, checkpoints and monitors."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
                "validate": {"model", "dataloaders", "datamodule"}}

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        # --help says what these do in tinylm, not Lightning's docstrings (its defaults are tinylm's to choose)
        parsers = self._subcommand_parsers.values() if add_subcommands else [self.parser]
        for parser in parsers:
            for action in parser._actions:
                action.help = _HELP.get(action.dest, action.help)

    def parse_arguments(self, parser, args) -> None:
        argv = sys.argv[1:] if args is None else args
        self._named = _named_options(list(argv)) if isinstance(argv, (list, tuple)) else set()
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser) -> None:
        from tinylm.train.callbacks import SampleText

        parser.add_class_arguments(RunOptions, "run")
        parser.add_lightning_class_args(SampleText, "samples")
        # Each fact has one source: the data side decides context length and vocabulary.
        parser.link_arguments("data.block_size", "model.block_size")
        # (on instantiate: the built data module's vocab_size, the tokenizer's real size, not the option's target)
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.eos_id", "model.eos_id", apply_on="instantiate")

    # ---- the run folder ----------------------------------------------------------------------------------------
    def _section(self):
        return self.config[self.config["subcommand"]]

    def _parse_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path last`` to this run's file, check the run folder, and take the model's
        hyperparameters from the checkpoint.

        Overrides LightningCLI's private hook (the only place between parsing and instantiation; see
        tests/test_lightning_private_api.py). Lightning applies checkpoint hyperparameters for paths but not for
        ``last`` (#20801), silently, and reads the whole file; here both behave the same, every ignored override is
        named in one warning, and only the metadata is read (mmap).
        """
        sub = self.config.get("subcommand")
        cfg = self._section()
        check_trainer_options(dict(cfg.trainer), sub)
        self.run_dir = run_dir_of(cfg.trainer.get("default_root_dir"), cfg.run.name)
        self.resume_step: int | None = None
        self.wandb_id: str | None = None
        asked = ckpt_path = cfg.get("ckpt_path")
        if ckpt_path == "last":
            cfg.ckpt_path = ckpt_path = latest_checkpoint(self.run_dir)
        elif ckpt_path == "best":
            best = self.run_dir / "checkpoints" / "best.ckpt"
            if not best.is_file():
                raise FileNotFoundError(f"--ckpt_path best: {best} not found (a run's best.ckpt is saved at its "
                                        "first validation); pass `last` or the path of a .ckpt")
            cfg.ckpt_path = ckpt_path = str(best)
        elif ckpt_path in ("hpc", "registry") or str(ckpt_path).startswith("registry:"):
            raise ValueError(f"--ckpt_path {ckpt_path} is not used by tinylm; pass `last`, `best` or the path of a "
                             ".ckpt written by `tinylm fit`")
        if sub == "validate" and asked == "last" and not ckpt_path:
            raise FileNotFoundError(f"--ckpt_path last: {self.run_dir} holds no checkpoint (`last` and `best` are "
                                    "those of the run that --config, or --run.name, names); pass the run's --config "
                                    "or the path of a .ckpt")
        if sub == "validate" and not ckpt_path:
            raise ValueError("tinylm validate needs --ckpt_path PATH (a checkpoint written by `tinylm fit`, e.g. "
                             f"{self.run_dir / 'checkpoints' / 'best.ckpt'}); without one it would evaluate random "
                             "weights")
        if ckpt_path and not Path(ckpt_path).is_file():
            what = "is a folder" if Path(ckpt_path).is_dir() else "not found"
            raise FileNotFoundError(f"checkpoint {ckpt_path!r} {what}; pass --ckpt_path PATH to a .ckpt written by "
                                    "`tinylm fit` (e.g. runs/NAME/checkpoints/last.ckpt), or `last` for this run's "
                                    "latest")
        # a resume in the checkpoint's own run folder (not a branch into another): it continues the run's records
        self.continues = bool(ckpt_path) and self.run_dir.resolve() in Path(ckpt_path).resolve().parents
        if sub == "fit" and _rank_zero():  # other ranks (launched by rank zero's Trainer) share its folder
            self._check_run_folder(ckpt_path, asked)
        if sub == "fit" and asked == "last" and not ckpt_path:  # (after the check: a folder of logs is refused)
            log.info("--ckpt_path last: %s has no checkpoint yet; starting the run from step 0", self.run_dir)
        if ckpt_path:
            self._apply_checkpoint(ckpt_path, cfg, sub)

    def _check_run_folder(self, ckpt_path: str | None, asked: str | None = None) -> None:
        self._lock = lock_run_folder(self.run_dir)  # held until the process ends: one writer per run folder
        ckpts = self.run_dir / "checkpoints"  # made at the first save: found now, not after the training
        if ckpts.is_symlink() and not ckpts.exists() or ckpts.exists() and not ckpts.is_dir():
            raise FileExistsError(errno.EEXIST, "File exists", str(ckpts))
        if holds_run(self.run_dir) and not self.continues:
            what = f"a run from {ckpt_path}" if ckpt_path else "the run again from step 0 (what --ckpt_path last " \
                "does without a checkpoint)" if asked == "last" else "a fresh run"
            found, broken = checkpoints_by_step(self.run_dir / "checkpoints")
            if not found:  # logs only, or only damaged checkpoints: --ckpt_path last has nothing to go on from
                why = f"its checkpoints ({', '.join(broken)}) are damaged" if broken else "it stopped before its first"
                raise TinyLMError(
                    f"{self.run_dir} holds a run that saved no readable checkpoint ({why}), so there is nothing to "
                    f"continue; refusing to start {what} over it. Start a new run with --run.name NEW_NAME, or delete "
                    f"{self.run_dir} to reuse its name")
            raise TinyLMError(
                f"{self.run_dir} already holds a run; refusing to start {what} over it. Continue it with "
                f"--ckpt_path last, or start a new run with --run.name NEW_NAME")
        if self.continues:
            # the newest readable checkpoint, whatever its name (last.ckpt may be missing or damaged)
            found, _ = checkpoints_by_step(self.run_dir / "checkpoints")
            latest = max((step for step, _, _ in found), default=None)
            at = next((step for step, _, p in found if p.resolve() == Path(ckpt_path).resolve()), latest)
            if latest is not None and at < latest:  # going back here would drop later history and checkpoints
                raise TinyLMError(
                    f"{ckpt_path} is at step {at} but {self.run_dir} has gone on to step {latest}; continuing from it "
                    f"here would discard steps {at}-{latest} of this run's logs and overwrite its last.ckpt. Branch "
                    f"from it into a new folder with --run.name NEW_NAME (same --ckpt_path), or continue the run "
                    f"with --ckpt_path last")

    def _apply_checkpoint(self, ckpt_path: str, cfg, sub: str) -> None:
        """Take the model's hyperparameters (and for validate the data it trained on) from ``ckpt_path``; for fit,
        refuse a resume with nothing to train or with settings that would not continue the run."""
        from tinylm.checkpoint import load_checkpoint, tinylm_section

        ckpt = load_checkpoint(ckpt_path, mmap=True)  # mmap: only the metadata is read here
        meta = tinylm_section(ckpt, ckpt_path)
        self.ckpt_step = int(ckpt.get("global_step", 0))
        if sub == "fit":
            self._check_resume(ckpt, meta, cfg, ckpt_path)
        defaults = self._parser(sub).get_defaults()
        update = {"model": self._model_from(ckpt, meta, cfg, sub, ckpt_path, defaults)}
        if sub == "validate" and (data := self._data_from(ckpt, meta, cfg, defaults)):
            update["data"] = data
        self.config = self.parser.parse_object({sub: update}, self.config)

    def _check_resume(self, ckpt: dict, meta: dict, cfg, ckpt_path: str) -> None:
        self.resume_step = self.ckpt_step  # the CSV and W&B logs continue from the checkpoint
        # the W&B run too, where this is the checkpoint's own run folder: a branch into another folder logging
        # into its parent's W&B run would log its steps a second time there, under the branch's name
        if self.continues:
            self.wandb_id = meta.get("wandb_id")
        max_steps = cfg.trainer.get("max_steps")
        if max_steps is not None and self.ckpt_step >= max_steps:
            raise TinyLMError(f"{ckpt_path} is already at step {self.ckpt_step} >= --trainer.max_steps "
                              f"{max_steps}: nothing to train; pass a larger --trainer.max_steps to go on")
        _check_time_left(ckpt, cfg.trainer.get("max_time"), ckpt_path)
        _check_accumulation(ckpt, cfg.trainer.get("accumulate_grad_batches"), ckpt_path,
                            cfg.trainer.get("val_check_interval"))
        from tinylm.data import TinyLMDataModule

        TinyLMDataModule.check_split_before_preparing(ckpt.get(TinyLMDataModule.__qualname__) or {},
                                                      cfg.data.get("val_fraction"))

    def _model_from(self, ckpt: dict, meta: dict, cfg, sub: str, ckpt_path: str, defaults) -> dict:
        """The checkpoint's model hyperparameters that this command takes (warning about the user's it ignores)."""
        from tinylm.checkpoint import architecture_fields
        from tinylm.model.config import config_fields
        from tinylm.train.module import TinyLM

        saved = dict(ckpt.get("hyper_parameters") or {})
        saved.pop("_instantiator", None)
        known = set(inspect.signature(TinyLM.__init__).parameters) - {"self"}
        unknown = sorted(set(saved) - known)
        if unknown:  # version skew: a checkpoint from another tinylm version
            log.warning("checkpoint %s has hyperparameters this tinylm does not know: %s (ignored)",
                        ckpt_path, ", ".join(unknown))
        # how the model runs, not what it computes: this run's own settings (turn recomputation on after an OOM)
        saved = {k: v for k, v in saved.items() if k in known and k not in RUNTIME_OPTIONS}
        linked = config_fields("data")  # come from the data; checked against it on load
        # a run from init_from took its architecture from the weights, never from the config: nothing to ignore there
        source = saved.get("init_from") or meta.get("init_from")  # the run's start, or a resume's record of it
        from_weights = architecture_fields() if source is not None else ()
        saved["init_from"] = source
        # a value at its default that the command does not name was not set by the user (validate without
        # --config): nothing to ignore; `--model.dropout 0.0` (the default) is named, and ignored
        ignored = [f"model.{k}={cfg.model[k]!r} (checkpoint: {v!r})" for k, v in saved.items()
                   if k not in linked and k not in from_weights and k in cfg.model and cfg.model[k] != v
                   and (cfg.model[k] != defaults.model.get(k) or f"model.{k}" in self._named)]
        if ignored:
            log.warning("%s %s: model hyperparameters come from the checkpoint; ignoring %s%s",
                        "resuming from" if sub == "fit" else "evaluating", ckpt_path, ", ".join(ignored),
                        " (to change them, start a new run)" if sub == "fit" else "")
        if sub == "fit":
            _warn_schedule_change(ckpt, saved, cfg.trainer.get("max_steps"), ckpt_path)
            _warn_training_changes(cfg, ckpt_path, n_embd=saved.get("n_embd"))
        for key in linked:
            saved.pop(key, None)
        if source is not None:  # the checkpoint holds the weights, and the shape they gave
            log.info("resuming from %s: its weights came from model.init_from %s; that source is not read again",
                     ckpt_path, source)
            saved["init_from"] = None  # or a moved or rewritten source would break or silently change the run
        return saved

    def _data_from(self, ckpt: dict, meta: dict, cfg, defaults) -> dict:
        """For validate: the data options the run trained on, where the command does not set them otherwise."""
        trained = dict(ckpt.get("datamodule_hyper_parameters") or {})
        # data.vocab_size: the target a BPE tokenizer was trained to, which finds it in the cache (checkpoints
        # before it was kept: the model's vocabulary, the same unless the corpus had too few merges)
        target = trained.pop("target_vocab_size", None) or (ckpt.get("hyper_parameters") or {}).get("vocab_size")
        if target is not None:
            trained["vocab_size"] = target
        data = {k: v for k, v in trained.items() if k in cfg.data and cfg.data[k] == defaults.data.get(k)
                and f"data.{k}" not in self._named and cfg.data[k] != v}
        if {**cfg.data, **data}.get("corpus") != trained.get("corpus"):
            data.pop("weights", None)  # the run's mixture weights go with its corpora, not with --data.corpus OTHER
        from tinylm.tokenize import TRAINED_SPECS

        now = {**cfg.data, **data}
        if meta.get("tokenizer") and (now.get("tokenizer") in TRAINED_SPECS or "data.tokenizer" not in self._named):
            # the checkpoint's own: one trained now (on another corpus, or the run's edited since) would be
            # another tokenizer than the model's, and a tokenizer file may have moved or changed since
            from tinylm.data.prepare import checkpoint_tokenizer_dir, default_cache_dir

            data["tokenizer"] = str(checkpoint_tokenizer_dir(meta["tokenizer"],
                                                             now.get("cache_dir") or default_cache_dir()))
            if now.get("corpus") != trained.get("corpus"):
                log.info("evaluating on data.corpus %s with the checkpoint's own %s tokenizer (trained on %s)",
                         now.get("corpus"), now["tokenizer"], trained.get("corpus"))
        return data

    # ---- the trainer -------------------------------------------------------------------------------------------
    def instantiate_trainer(self, **kwargs: Any):
        from tinylm.device import resolve_precision
        from tinylm.train.run import run_callbacks

        sub = self.subcommand
        trainer_cfg = dict(self.config_init[sub]["trainer"])
        run: RunOptions = self.config_init[sub]["run"]
        checkpointing = trainer_cfg.get("enable_checkpointing") is not False
        if sub == "fit":
            callbacks = run_callbacks(self.run_dir / "checkpoints" if checkpointing else None,
                                      every_n_steps=run.checkpoint_every, keep=run.keep_checkpoints,
                                      progress_bar=trainer_cfg.get("enable_progress_bar") is not False)
        else:
            from tinylm.train.callbacks import ProgressBar

            callbacks = [ProgressBar()] if trainer_cfg.get("enable_progress_bar") is not False else []
        user_callbacks = trainer_cfg.get("callbacks") or []
        trainer_cfg["callbacks"] = (user_callbacks if isinstance(user_callbacks, list) else [user_callbacks]) + callbacks
        trainer_cfg["default_root_dir"] = str(self.run_dir)
        trainer_cfg["logger"] = self._loggers(trainer_cfg.get("logger"), run)
        trainer_cfg["plugins"] = _with_atomic_checkpoints(trainer_cfg.get("plugins"))
        trainer_cfg["precision"] = resolve_precision(trainer_cfg.get("precision"), self.model.hparams.n_embd)
        if sub == "fit":
            _warn_gpu_recipe_on_cpu(trainer_cfg, self.model.hparams, self.datamodule)
            self.model.wandb_id = self.wandb_id
        extra = [self.config_init[sub][c] for c in self._parser(sub).callback_keys]
        return self._instantiate_trainer({**trainer_cfg, **kwargs}, extra)

    def _loggers(self, user: Any, run: RunOptions) -> Any:
        """tinylm's CSV (+ W&B) loggers joined by the user's; ``--trainer.logger false`` turns all logging off.
        `validate` logs nothing by default: its result goes to ``<run dir>/validate/metrics.csv``."""
        from lightning.pytorch.loggers import Logger

        if user is False:
            log.info("--trainer.logger false: no metrics are logged (no csv/metrics.csv, no W&B)")
            return False
        mine: list[Logger] = []
        if self.subcommand == "fit":
            from tinylm.train.loggers import make_loggers

            mine = make_loggers(self.run_dir, run.name, run.wandb_project, wandb_id=self.wandb_id,
                                resume_step=self.resume_step)
        theirs = [] if user in (None, True) else list(user) if isinstance(user, (list, tuple)) else [user]
        return mine + theirs or False

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        from lightning.pytorch.strategies.launchers import subprocess_script

        # LightningCLI adds its SaveConfigCallback here; ours writes <run dir>/config.yaml (fit only)
        self.save_config_callback = None
        trainer = super()._instantiate_trainer(config, callbacks)
        if isinstance(trainer.strategy.launcher, subprocess_script._SubprocessScriptLauncher):
            # ddp's launcher starts it with the ranks it ran (a weak reference: the module outlives the trainer)
            subprocess_script._launch_process_observer = functools.partial(_watch_ranks, trainer=weakref.ref(trainer))
            # the ranks it starts (from this environment) say no torch warning of their own, as they say no Python
            # warning (rank 0 says the same): also none when rank 0 left on a SIGTERM while they connected
            # ("sendBytes failed ... Broken pipe" and its C++ stack); their errors are still said
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
            if not trainer.strategy.cluster_environment.creates_processes_externally:
                os.environ[_RANK0_PID] = str(os.getpid())  # this process starts the ranks: they watch it
            elif (rank0 := _rank0_pid()) is not None:
                _watch_rank0(rank0, weakref.ref(trainer))
        if self.subcommand == "fit":
            saver = RunConfig(self._parser("fit"), self.config["fit"], run_dir=self.run_dir,
                              resume_step=self.resume_step, continues=self.continues, **self.save_config_kwargs)
            trainer.callbacks.append(saver)
        return trainer

    # ---- after the command -------------------------------------------------------------------------------------
    def before_fit(self) -> None:
        _warn_small_vocab(self.datamodule)
        self.model.check_init_tokenizer(getattr(self.datamodule, "tokenizer", None))  # before the run writes
        self._record_architecture_from_weights()

    def _record_architecture_from_weights(self) -> None:
        """model.init_from takes the architecture from the weights: name the options set otherwise (a config's or
        the command line's) that it overrides, and have config.yaml (written at setup) record the model built."""
        from tinylm.checkpoint import architecture_fields

        cfg = self.config["fit"]
        if cfg.model.get("init_from") is None:  # also on resume: the checkpoint gave the architecture
            return
        built, defaults = self.model.hparams, self._parser("fit").get_defaults().model
        overridden = [f"model.{k}={cfg.model[k]!r} (weights: {built[k]!r})" for k in architecture_fields()
                      if k in cfg.model and cfg.model[k] != built[k] and cfg.model[k] != defaults.get(k)]
        if overridden:
            log.warning("model.init_from %s: the architecture comes from the weights; ignoring %s",
                        cfg.model.init_from, ", ".join(overridden))
        for k in architecture_fields():
            if k in cfg.model:
                cfg.model[k] = built[k]

    def after_validate(self) -> None:
        """Print the result and append it to ``<run dir>/validate/metrics.csv`` at the checkpoint's step."""
        if not self.trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if k.startswith("val/")}
        row = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "checkpoint": str(self._section().ckpt_path),
               "step": getattr(self, "ckpt_step", 0), **metrics}
        ckpt = Path(self._section().ckpt_path).resolve()
        # the checkpoint's own run folder (runs/NAME/checkpoints/x.ckpt), whatever run the config names; for one
        # outside a run folder, the run the command names, else its own folder (the default run name's folder,
        # runs/tinylm/, mixed a loose file's results into that run's, or made a folder that looked like a run)
        named = self._named & {"config", "run", "run.name", "trainer.default_root_dir"}
        run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else self.run_dir if named else ckpt.parent
        path = run_dir.resolve() / "validate" / "metrics.csv"
        self.validate_result, self.validate_csv = row, path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_header = not path.is_file()
            fields = list(row)
            if not write_header:
                with open(path, newline="") as f:
                    fields = next(csv.reader(f), fields)
            with open(path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
                if write_header:
                    writer.writeheader()
                writer.writerow(row)
        except OSError as e:  # a read-only or full disk: the result is printed all the same
            log.warning("could not append the result to %s (%s)", path, e.strerror or e)
            self.validate_csv = None


_RANKS: list = []  # the rank processes that DDP's launcher started from this one (rank 0), as subprocess.Popen
_STUCK_S = 20.0  # this process still training this long after a rank ended waits for it in a call that never returns
_RANK0_PID = "TINYLM_RANK0_PID"  # rank 0 (DDP's launcher) tells the ranks it starts its pid, in their environment
_RANK0: int | None = None  # in a rank that rank 0 started: rank 0's pid, watched by `_watch_rank0`
_ORPHAN_S = 5.0  # a rank still in training this long after rank 0 was gone waits for it in a call that never returns
_COMMAND: list = ["fit"]  # the command this process runs and its arguments (no --verbose): what the lines name


def _go_on() -> str:
    """How to go on after a run stopped: resume a fit, run any other command (validate) again. The hint is spelled
    out with this process's own command and arguments by `tinylm.cli.error_line`."""
    hint = "`tinylm fit --config ... --ckpt_path last`"
    return f"resume with {hint}" if _COMMAND[0] == "fit" else f"run the same {hint} again"


def _rank0_pid() -> int | None:
    """In a rank that DDP's launcher (rank 0) started: rank 0's pid; else None."""
    pid = os.environ.get(_RANK0_PID, "")
    return int(pid) if pid.isdigit() and int(pid) != os.getpid() else None


def _watch_rank0(pid: int, trainer: weakref.ref) -> None:
    """Watch rank 0 from a rank it started. A `kill -9` of rank 0 (the command itself, or the out-of-memory killer)
    left this rank to fail on its next collective with a gloo traceback after the shell's prompt, or, while the ranks
    still connected, waiting for it for good (torch's rendezvous timeout, 30 min)."""
    global _RANK0
    _RANK0 = pid
    threading.Thread(target=_watch_for_rank0, args=(pid, trainer), daemon=True, name="tinylm-rank0-watch").start()


def _watch_for_rank0(pid: int, trainer: weakref.ref, every: float = 0.5) -> None:
    import signal

    from lightning.pytorch.trainer.states import TrainerStatus

    while os.getppid() == pid:  # rank 0 started this process: another parent means rank 0 is gone
        time.sleep(every)
    # Rank 0 ends the ranks it started before it ends on an error (end_ranks); gone without that, it was killed.
    # This rank then fails on its next collective with it, and says so (main: lost_rank); unless it waits for rank 0
    # in a call that never returns (the ranks' connecting, an NCCL collective): then it is ended here, with its line.
    deadline = time.monotonic() + _ORPHAN_S
    while time.monotonic() < deadline:
        if (t := trainer()) is None or t.state.status not in (TrainerStatus.INITIALIZING, TrainerStatus.RUNNING):
            return  # it stopped (on that error, or at the end): it ends on its own
        time.sleep(0.05)
    from tinylm.cli import error_line

    sys.stderr.write(error_line(_COMMAND[0], str(lost_rank(wait=0)), _COMMAND[1:], _rank()))
    sys.stderr.flush()
    for child in multiprocessing.active_children():  # its loader's workers: not left behind
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
    os._exit(1)


def _watch_ranks(ranks: list, trainer: weakref.ref) -> None:
    """Watch the ranks DDP's launcher started, in place of Lightning's watch, which SIGKILLed this process within
    5 s of a rank's error, wordless (exit 137), also while it was saving or saying why it stopped."""
    _RANKS[:] = ranks
    threading.Thread(target=_watch, args=(ranks, trainer), daemon=True, name="tinylm-rank-watch").start()


def _watch(ranks: list, trainer: weakref.ref, every: float = 1.0) -> None:
    import signal

    import torch.distributed as dist
    from lightning.pytorch.trainer.states import TrainerStatus

    while not any(p.poll() for p in ranks):
        if all(p.returncode == 0 for p in ranks):
            return
        time.sleep(every)
    # A rank ended with an error. This process then ends too, on its own (a collective with the lost rank fails at
    # once; a stop on a signal or a health check ends every rank), and its own ending (a save, W&B's upload) takes
    # what it takes; unless it waits for that rank in a call that never returns: the ranks' connecting (30 min), an
    # NCCL collective. Then it is ended here, with its line.
    if dist.is_available() and dist.is_initialized():
        deadline = time.monotonic() + _STUCK_S
        while time.monotonic() < deadline:
            if (t := trainer()) is not None and t.state.status != TrainerStatus.RUNNING:
                return  # it stopped training (an error's handling, or the end): it ends on its own
            time.sleep(every)
    from tinylm.cli import error_line

    lost = lost_rank()
    for p in ranks:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    if not lost.said:
        sys.stderr.write(error_line(_COMMAND[0], str(lost), _COMMAND[1:]))
        sys.stderr.flush()
    os._exit(lost.exit_code)


# what a collective says when the other end went away (gloo's two, NCCL's): that rank is ending, if slowly
_PEER_GONE = ("closed by peer", "reset by peer", "remote process exit")


def lost_rank(wait: float = 2.0, raised: BaseException | None = None) -> TinyLMError | None:
    """Why a rank that DDP's launcher started from this process ended before it: the error this process reports
    instead of the failed collective's traceback. A signal's (the rank had no chance to say so itself); or, when
    the rank ended with an error of its own, which it said, one with ``said`` set, ending this process with the
    rank's exit status and no word. None when every rank is alive. ``raised``, this process's error, saying that a
    peer closed its connection, waits up to 30 s: a rank closes its connections as it ends, and on a loaded machine
    its end (its line, its exit hooks) took more than ``wait``, and the collective's traceback followed its line."""
    import signal

    if raised is not None and any(words in str(raised) for words in _PEER_GONE):
        wait = max(wait, 30.0)

    if _RANK0 is not None:  # a rank that rank 0 started: rank 0 gone is what ended it
        deadline = time.monotonic() + wait  # rank 0's connections close before it is gone (this one reparented)
        while os.getppid() == _RANK0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.getppid() == _RANK0:
            return None
        error = TinyLMError(f"rank 0 (pid {_RANK0}), the command that started this rank, ended without a word (killed: "
                            "kill -9, or the kernel's out-of-memory killer); the other ranks cannot go on without it, "
                            f"so the run stopped; {_go_on()}")
        error.exit_code, error.said = 1, False
        return error
    deadline = time.monotonic() + wait  # a rank killed a moment ago closes its connections before it can be reaped
    while _RANKS and not any(p.poll() for p in _RANKS) and time.monotonic() < deadline:
        time.sleep(0.05)
    first = int(os.environ.get("NODE_RANK", "0")) * (len(_RANKS) + 1)  # this machine's rank 0 (num_nodes > 1)
    for rank, proc in enumerate(_RANKS, start=first + 1):
        code = proc.poll()
        by = -code if code is not None and code < 0 else code - 128 if code in (130, 143) else None
        if by in (signal.SIGTERM, signal.SIGINT):  # a stop asked of the run that the rank could not agree on with
            # this one (it was starting; or this one was): what one process says
            error = TinyLMError(f"terminated by {signal.Signals(by).name} before it finished; run the same `tinylm "
                                f"{_COMMAND[0]}` again")
            error.exit_code, error.said = 128 + by, False
            return error
        if by is not None:
            name = signal.Signals(by).name if by in set(signal.Signals) else f"signal {by}"
            oom = " (also what the kernel's out-of-memory killer sends)" if by == signal.SIGKILL else ""
            error = TinyLMError(f"rank {rank} (pid {proc.pid}) was killed by {name}{oom}; the other ranks cannot go "
                                f"on without it, so the run stopped; {_go_on()}")
            error.exit_code, error.said = 1, False
            return error
    for rank, proc in enumerate(_RANKS, start=first + 1):
        if proc.returncode:  # its own error, in a line of its own ("(rank 1) OSError: no space left ...")
            error = TinyLMError(f"rank {rank} (pid {proc.pid}) stopped on an error, which it said")
            error.exit_code, error.said = proc.returncode, True
            return error
    return None


def end_ranks(wait: float = 1.0) -> None:
    """End the ranks DDP's launcher started from this process as it ends on an error: one waiting for it in a
    collective would otherwise fail as it leaves, with a traceback after the command ended (or, on NCCL, wait on)."""
    deadline = time.monotonic() + wait  # (a rank stopping with this one, on a signal or a health check, ends first)
    while any(p.poll() is None for p in _RANKS) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in _RANKS:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def latest_checkpoint(run_dir: Path) -> str | None:
    """What ``--ckpt_path last`` means: the newest readable checkpoint of the run folder by step, ``last.ckpt`` when
    it is that; else (a damaged or missing last.ckpt, or one older than a step-N.ckpt because the run died between
    the two saves, or a run killed before its first periodic save with only a ``best.ckpt``) the newest other one,
    with a warning. None when the folder holds none."""
    found, broken = checkpoints_by_step(run_dir / "checkpoints")
    if not found:
        return None
    step, is_last, path = max(found)  # at one step, last.ckpt first
    if not is_last:
        last = next((s for s, is_l, _ in found if is_l), None)
        why = ("is damaged" if "last.ckpt" in broken else "is missing" if last is None
               else f"is at step {last}, behind it (a validation saved it since)" if path.name == "best.ckpt"
               else f"is at step {last}, behind it (the run stopped between two saves)")
        log.warning("--ckpt_path last: %s %s; continuing from the newest readable checkpoint, %s (step %d)",
                    run_dir / "checkpoints" / "last.ckpt", why, path.name, step)
    return str(path)


_TRAINING_OPTIONS = ("gradient_clip_val", "accumulate_grad_batches", "precision")
"""Trainer options that change what a resumed run computes (a checkpoint does not hold them, so they apply)."""


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _run_config(ckpt_path: str) -> dict:
    """The newest config*.yaml of the checkpoint's run folder (what the run trained with last); {} if none."""
    configs = sorted(Path(ckpt_path).resolve().parent.parent.glob("config*.yaml"), key=lambda p: p.stat().st_mtime)
    return _read_yaml(configs[-1]) if configs else {}


def _warn_training_changes(cfg, ckpt_path: str, *, n_embd: int | None = None) -> None:
    """Name the trainer options that change the training and that a resume sets otherwise than the run had (in its
    newest config*.yaml, beside the checkpoint's folder), and a seed_everything that has no effect: model options are
    taken from the checkpoint with a warning; these apply, and the run goes on as another run."""
    folder = Path(ckpt_path).resolve().parent.parent
    newest = _run_config(ckpt_path)
    if not newest:
        return
    trainer = newest.get("trainer") or {}  # what the run trained with last
    now = {k: cfg.trainer.get(k) for k in _TRAINING_OPTIONS}
    if n_embd and "precision" in trainer:  # an unset precision is resolved by device and width, here as there
        from tinylm.device import resolve_precision

        trainer = {**trainer, "precision": resolve_precision(trainer["precision"], n_embd)}
        now["precision"] = resolve_precision(now["precision"], n_embd)
    changed = [f"trainer.{k} {now[k]!r} (the run had {trainer.get(k)!r})" for k in _TRAINING_OPTIONS
               if k in trainer and now[k] != trainer.get(k)]
    if changed:
        log.warning("resuming from %s with %s: the resumed steps train with the new value%s, not as the run did",
                    ckpt_path, ", ".join(changed), "s" if len(changed) > 1 else "")
    data = newest.get("data") or {}
    if "val_batches" in data and cfg.data.get("val_batches") != data["val_batches"]:
        log.warning("resuming from %s with data.val_batches %r (the run had %r): val/loss is measured on other "
                    "windows from here on, so its curve jumps and best.ckpt is picked across the two",
                    ckpt_path, cfg.data.get("val_batches"), data["val_batches"])
    started = _read_yaml(folder / "config.yaml")  # the seed the run started from (a resume's own seed has no effect)
    seed = cfg.get("seed_everything")
    if "seed_everything" in started and seed not in (None, True) and seed != started["seed_everything"]:
        log.warning("resuming from %s: seed_everything %r has no effect (the run started with %r); the checkpoint "
                    "restores the run's random state, so dropout and data order go on as they were", ckpt_path, seed,
                    started["seed_everything"])


def _warn_schedule_change(ckpt: dict, hparams: dict, max_steps: int | None, ckpt_path: str) -> None:
    """Name the learning-rate jump of a resume whose schedule length changed (its length is trainer.max_steps
    unless model.decay_steps was set): the cosine is stretched from here on, not continued."""
    from tinylm.train.schedules import lr_at

    try:
        was = float(ckpt["lr_schedulers"][0]["_last_lr"][0])  # the LR the next step would have used
        step = int(ckpt["global_step"])
        now = lr_at(step, schedule=hparams["lr_schedule"], lr=hparams["lr"], min_lr=hparams["min_lr"],
                    warmup_steps=hparams["warmup_steps"], decay_steps=hparams.get("decay_steps") or max_steps,
                    decay_fraction=hparams.get("decay_fraction", 0.2))
    except (KeyError, IndexError, TypeError, ValueError):  # an older checkpoint, another scheduler
        return
    if max_steps and not math.isclose(was, now, rel_tol=1e-6, abs_tol=1e-12):
        log.warning("resuming from %s at step %d with trainer.max_steps %d: the LR schedule's length is max_steps "
                    "(model.decay_steps is unset), so the LR jumps from %.3g to %.3g and the decay is stretched over "
                    "the new length; pin model.decay_steps when you start a run you may extend", ckpt_path, step,
                    max_steps, was, now)


def _check_time_left(ckpt: dict, max_time: Any, ckpt_path: str) -> None:
    """Refuse a resume whose --trainer.max_time the run has already spent: Lightning's Timer keeps the training
    time in the checkpoint and counts on from it (max_time is the run's total), so the resume would stop at once,
    train nothing, and say it can go on: repeated, it never would."""
    spent = (((ckpt.get("callbacks") or {}).get("Timer") or {}).get("time_elapsed") or {}).get("train")
    if max_time is None or spent is None:
        return
    from lightning.pytorch.callbacks import Timer

    try:  # Timer's own parsing of "DD:HH:MM:SS", a dict of timedelta's arguments, or a timedelta
        budget = Timer(duration=dict(vars(max_time)) if hasattr(max_time, "__dict__") else max_time)._duration
    except (TypeError, ValueError):
        return  # Lightning names the bad value when it builds its Timer
    if budget is not None and spent >= budget:
        raise TinyLMError(f"--trainer.max_time {max_time} is already spent: {ckpt_path} has trained for {spent:.0f} s "
                          "(Lightning's Timer keeps a run's training time in its checkpoints and counts on from it: "
                          "max_time is the run's total); pass a larger --trainer.max_time, or leave it out")


def _check_accumulation(ckpt: dict, accumulate: Any, ckpt_path: str, val_check_interval: Any = None) -> None:
    """Refuse a resume whose --trainer.accumulate_grad_batches does not divide the micro-batches the checkpoint's
    epoch has done: Lightning steps when that count reaches a multiple of it, so the first step would sum fewer
    micro-batches than it divides by (a gradient too small by that ratio, and clipped as such)."""
    try:
        progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]
        done, epoch_ended = int(progress["current"]["ready"]), bool(progress["is_last_batch"])
    except (KeyError, TypeError, ValueError):  # not a Lightning training checkpoint: restoring it will say so
        return
    if not isinstance(accumulate, int) or accumulate <= 1 or epoch_ended or done % accumulate == 0:
        return
    short = accumulate - done % accumulate
    every = val_check_interval if isinstance(val_check_interval, int) else None
    # the values that divide both the micro-batches done and the validation interval (fit's own check)
    usable = [a for a in range(2, min(done, 4 * accumulate) + 1) if done % a == 0 and (every is None or every % a == 0)]
    near = sorted(sorted(usable, key=lambda a: abs(a - accumulate))[:3])
    had = (_run_config(ckpt_path).get("trainer") or {}).get("accumulate_grad_batches")
    own = f"the run's own {had}" if isinstance(had, int) else "the run's own value"
    fits = f" or one that divides {done}" + (f" and trainer.val_check_interval {every}" if every else "") + \
           f" ({', '.join(map(str, near))})" if near else ""
    raise TinyLMError(f"--trainer.accumulate_grad_batches {accumulate} does not divide the {done} micro-batches "
                      f"{ckpt_path} has done in its epoch: the first step would sum {short} micro-batches, each "
                      f"divided by {accumulate}; resume with {own}{fits}")


def _with_atomic_checkpoints(plugins: Any) -> list:
    """The user's plugins plus tinylm's atomic CheckpointIO, unless they bring a CheckpointIO of their own."""
    from lightning.pytorch.plugins.io import CheckpointIO

    from tinylm.checkpoint import AtomicCheckpointIO

    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, CheckpointIO) for p in plugins):
        log.warning("--trainer.plugins brings its own CheckpointIO: tinylm's atomic checkpoint writes are off")
        return plugins
    return plugins + [AtomicCheckpointIO()]


def _warn_gpu_recipe_on_cpu(trainer_cfg: dict[str, Any], hparams, dm) -> None:
    """A GPU recipe (compile, many loader workers, a wide model) run on a CPU takes minutes per step: say so once,
    with the fix, instead of leaving the user to wonder (shakespeare-char.yaml ran at ~75 s/step on 2 cores)."""
    import torch

    accelerator = str(trainer_cfg.get("accelerator") or "auto")
    if accelerator not in ("cpu", "auto") or (accelerator == "auto" and torch.cuda.is_available()):
        return
    slow = []
    if hparams.get("compile_model"):
        slow.append("model.compile_model true (minutes of compilation)")
    flops = 6 * hparams["n_layer"] * 12 * hparams["n_embd"] ** 2 * getattr(dm, "batch_size", 1) * hparams["block_size"]
    if flops > 5e11:  # ~6 N B T > 0.5 TFLOP per micro-batch: seconds per step on a laptop CPU
        slow.append(f"a {hparams['n_layer']}-layer, {hparams['n_embd']}-wide model on batches of "
                    f"{getattr(dm, 'batch_size', '?')} x {hparams['block_size']} tokens")
    if slow and getattr(dm, "num_workers", 0) > 0:  # on their own, a few workers are fine on a CPU
        slow.append(f"data.num_workers {dm.num_workers} (workers compete with training for the cores)")
    if slow:
        warnings.warn("this recipe is sized for a GPU and will be very slow on this CPU: " + "; ".join(slow)
                      + ". For a laptop use configs/shakespeare-char-cpu.yaml (or override those options)")


def _warn_small_vocab(dm) -> None:
    """A trained BPE far below the requested size (a small corpus) is worth a line at fit time, not only in
    `prepare`: the model's embedding is sized by the real vocabulary."""
    if dm is None or getattr(dm, "tokenizer_spec", None) not in ("bpe", "scratch-bpe"):
        return
    got, wanted = dm.vocab_size, dm.target_vocab_size
    if got < 0.9 * wanted:
        warnings.warn(f"the {dm.tokenizer_spec} tokenizer has {got:,} ids, far below --data.vocab_size {wanted:,}: "
                      "the corpus is too small (or repetitive) for that many merges; the model uses "
                      f"{got:,}. Use a bigger corpus or a smaller --data.vocab_size to silence this")


def lightning_main(args: list[str], cli_class: type[TinyLMCLI] = TinyLMCLI) -> TinyLMCLI:
    """Run `fit` or `validate` with tinylm's model and data module; returns the CLI object. (``cli_class``: a
    subclass that stops earlier, for commands that only read a fit config: tinylm.cli.fit_config.)"""
    from tinylm.data import TinyLMDataModule
    from tinylm.train.module import TinyLM

    _COMMAND[:] = args
    # args are always passed explicitly (main() strips --verbose first), which Lightning warns about
    warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
    # a resumed run's checkpoint folder is not empty, and validate needs no training callbacks: both expected
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks used to create")
    # a branch (a new run from another run's checkpoint) tracks its own best.ckpt in its own folder, as it should
    warnings.filterwarnings("ignore", message="The dirpath has changed from")
    # tinylm's epochs are notional (a small corpus makes short ones) and logging counts steps across them
    warnings.filterwarnings("ignore", message=r"The number of training batches \(\d+\) is smaller than the logging")
    try:
        cli = cli_class(
            TinyLM,
            TinyLMDataModule,
            args=args,
            seed_everything_default=1337,
            auto_configure_optimizers=False,  # the optimizer and schedule are TinyLM's (--model.lr, --model.lr_schedule)
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"max_epochs": None, "check_val_every_n_epoch": None, "use_distributed_sampler": False,
                              "default_root_dir": RUNS_ROOT},
            parser_kwargs={"prog": "tinylm", "exit_on_error": False,
                           "fit": {"description": "Train a model: tinylm fit --config configs/NAME.yaml "
                                                  "[--trainer.max_steps N] [--ckpt_path last]"},
                           "validate": {"description": "Evaluate a checkpoint on the validation split: tinylm validate "
                                                       "--ckpt_path PATH (the data it was trained on), or "
                                                       "--config configs/NAME.yaml --ckpt_path PATH|last|best"}},
        )
    except BaseException as e:
        _finish_wandb(exit_code=1)
        if isinstance(e, SystemExit) and isinstance(e.__context__, KeyboardInterrupt):
            # Lightning ends its handling of a Ctrl+C (one before training, or a second one) in sys.exit(1), as a
            # failure; main() reports it as every command's Ctrl+C: "interrupted", exit 130
            raise e.__context__ from None
        raise
    else:
        _finish_wandb(exit_code=0)
        return cli
    finally:
        release_run_folders()


def _finish_forked_wandb(trainer) -> None:
    from lightning.pytorch.trainer.states import TrainerStatus

    _finish_wandb(exit_code=0 if trainer.state.status == TrainerStatus.FINISHED else 1)


def _finish_wandb(exit_code: int) -> None:
    """End this process's W&B run. Lightning's WandbLogger leaves it open, and a WandbLogger made later in the same
    process (the next rung of `tinylm scaling`, a notebook's second fit) reuses an open run: every rung logged into
    the first rung's W&B run."""
    wandb = sys.modules.get("wandb")  # not imported: no run was started
    if wandb is not None and getattr(wandb, "run", None) is not None:
        try:
            wandb.finish(exit_code=exit_code)
        except Exception as e:  # noqa: BLE001 (the run's own result or error is what the user needs to see)
            log.warning("W&B: could not end the run cleanly (%s: %s); its local files are in the run folder",
                        type(e).__name__, e)
