"""Checks of the Trainer options a user passes, before Lightning trips over them (or silently trains
something else), and the warnings of runs that will be slow or odd on this machine."""

from __future__ import annotations

import logging
import os
import re
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from tinylm.cli.launch_checks import check_launched_processes, check_nodes
from tinylm.errors import TinyLMError
from tinylm.machine import usable_cpus
from tinylm.ranges import check_ranges
from tinylm.train.parallel import check_strategy, check_strategy_name

log = logging.getLogger("tinylm")


# Trainer options that must be positive / non-negative numbers when set (a bad value otherwise fails deep inside
# Lightning, e.g. accumulate_grad_batches 0 -> ZeroDivisionError).
_POSITIVE = ("accumulate_grad_batches", "log_every_n_steps", "val_check_interval",
             "check_val_every_n_epoch", "num_nodes")
_NON_NEGATIVE = ("gradient_clip_val", "limit_val_batches", "limit_train_batches")


MEMORY_MARGIN = 1.25  # refuse only a step estimated at this many times the free memory: plan's activations ran
# ~11 % high on a CPU, and a run that just fits must never be refused
NO_MEMORY_CHECK = "TINYLM_NO_MEMORY_CHECK"  # set to 1: the check below says nothing (an estimate that is wrong)


def check_fits_in_memory(trainer: Any, module: Any, batch_size: int) -> None:
    """Refuse a run whose training step cannot fit in its device's free memory: `tinylm plan`'s estimate of weights,
    gradients, optimizer state and one micro-batch's activations (less the weights already in memory on a CPU) above
    `MEMORY_MARGIN` x the free memory. A batch of 64 x 1024 tokens at a 50k vocabulary went on to a 100-line
    allocator traceback, or on a CPU grew until the kernel killed it (and the machine waited on swap). One device or
    DDP (the launching process, once, for CPU ranks sharing the machine; each GPU rank for its device); FSDP2's
    shards are not checked. ``TINYLM_NO_MEMORY_CHECK=1`` turns it off."""
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    from tinylm.device import address_space_free, free_memory
    from tinylm.studies.plan import CUDA_WORKSPACES, memory

    if os.environ.get(NO_MEMORY_CHECK, "").strip() not in ("", "0") or not hasattr(module, "model") or \
            type(trainer.strategy) not in (SingleDeviceStrategy, DDPStrategy):
        return
    device, hp = trainer.strategy.root_device, module.hparams
    if device.type == "cuda" and getattr(trainer.strategy, "_start_method", "popen") != "popen":
        return  # ddp_fork / ddp_spawn: CUDA read here, in the process that forks its ranks, would break them
    if device.type == "cpu" and trainer.local_rank != 0:
        return  # the launching process checked for all of them, before they took memory of their own
    free = free_memory(device)
    ranks = trainer.num_devices if device.type == "cpu" else 1  # CPU ranks share the machine's memory
    step = memory(module.model, batch_size=batch_size, precision=str(trainer.precision),
                  checkpointing=bool(hp.get("activation_checkpointing")), optimizer=hp.get("optimizer", "adamw"),
                  accumulate=int(trainer.accumulate_grad_batches),
                  workspace=CUDA_WORKSPACES if device.type == "cuda" else 0).peak  # as `tinylm plan` counts it
    resident = sum(p.numel() * p.element_size() for p in module.parameters()) if device.type == "cpu" else 0
    need = ranks * step - resident  # (this process's weights are in memory already: not free, not needed again)
    if free is None or need <= MEMORY_MARGIN * free:
        return
    each = f" ({ranks} processes)" if ranks > 1 else ""
    limited = address_space_free() if device.type == "cpu" else None
    where = " under this process's address-space limit (ulimit -v)" if limited is not None and limited <= free else ""
    ckpt = "" if hp.get("activation_checkpointing") else ", or --model.activation_checkpointing true"
    raise TinyLMError(f"this run needs ~{_size(need)} more on {device.type}{each} (gradients, optimizer state and the "
                      f"activations of {batch_size} x {module.model.config.block_size} tokens: `tinylm plan` "
                      f"itemizes them) but {device.type} has {_size(free)} free{where}; lower --data.batch_size (raise "
                      f"--trainer.accumulate_grad_batches to keep the global batch) or --data.block_size{ckpt} "
                      f"({NO_MEMORY_CHECK}=1 skips this check)")


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def trainer_section(trainer: Any) -> dict[str, Any]:
    """The parsed ``trainer`` section as the checks read it: dict() flattens a class given with its arguments into
    dotted keys (``strategy.class_path``, which the strategy checks read), and so a callback given alone, not in a
    list (`--trainer.callbacks=Timer`), whose checks then never ran: that one is kept whole."""
    return {**dict(trainer), "callbacks": trainer.get("callbacks")}


def check_trainer_options(trainer_cfg: dict[str, Any], subcommand: str, *, runs: bool = True,
                          own_steps: bool = False) -> None:
    """Range checks of the Trainer options that Lightning only trips over later (or never). `runs`: the command
    runs the config as configured, its strategy's processes and validations (plan, lr-find and scaling do not:
    `tinylm plan --trainer.strategy fsdp` plans the memory of a strategy that `fit` refuses). `own_steps`: the
    command sets how many steps it trains (lr-find, scaling): trainer.max_steps may be left unset."""
    for key in _POSITIVE:
        value = trainer_cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"trainer.{key} must be > 0, got {value}")
    for key in _NON_NEGATIVE:
        value = trainer_cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"trainer.{key} must be >= 0, got {value}")
    # -1 is every validation batch; Lightning took -2 as 0 without a word
    check_ranges("trainer", trainer_cfg, {"num_sanity_val_steps": "[-1, inf)"}, whole=("num_sanity_val_steps",))
    check_devices(trainer_cfg, on_cpu=runs and _on_cpu(trainer_cfg))
    check_strategy_name(trainer_cfg.get("strategy"))  # a name Lightning does not know, wherever the config is read
    clip = trainer_cfg.get("gradient_clip_algorithm")  # (TinyLM checks it again for library users, at step 1)
    if clip is not None and str(getattr(clip, "value", clip)).lower() != "norm":
        raise ValueError(f"tinylm clips by norm only; got trainer.gradient_clip_algorithm={clip!r}: leave it unset "
                         "(or pass 'norm')")
    if trainer_cfg.get("barebones"):  # Lightning then refuses every logger, callback and checkpoint tinylm adds
        raise ValueError("trainer.barebones=true turns off logging, checkpoints and callbacks, and a tinylm run is "
                         "made of them (metrics.csv, last.ckpt, the health monitor); leave it out (for a bare speed "
                         "test: benchmarks/bench_train_step.py)")
    if trainer_cfg.get("model_registry"):  # Lightning uploads through the ModelCheckpoint it adds when a run has none
        # (litmodels' LitModelCheckpoint); a tinylm run always has its own, so the name was taken and nothing uploaded
        raise ValueError(f"trainer.model_registry {trainer_cfg['model_registry']!r} is not used by tinylm: Lightning "
                         "uploads only through the checkpoint callback it adds to a run that has none, and a tinylm "
                         "run has its own (best.ckpt, last.ckpt); leave it out, and upload a checkpoint yourself "
                         "(litmodels' upload_model), or share it with `tinylm export`")
    if trainer_cfg.get("use_distributed_sampler") is True:  # Lightning's default, which tinylm's sets to false
        # Lightning then rebuilt tinylm's loader around a DistributedSampler and failed on every rank, after setup,
        # with "Trying to inject parameters into the `ResumableLoader` instance ..." (advice for its author)
        raise ValueError("trainer.use_distributed_sampler=true is not used by tinylm: its loaders give each rank "
                         "its own windows already (batch k of rank r is a pure function of the seed, k and r: exact "
                         "resume on another device count), so there is no sampler to wrap; leave it out")
    check_callbacks(trainer_cfg.get("callbacks"))
    if runs:
        check_accelerator(trainer_cfg.get("accelerator"))
        _warn_more_ranks_than_cores(trainer_cfg)
    if subcommand == "validate" and trainer_cfg.get("limit_val_batches") in (0, 0.0):
        # Lightning then validates nothing without a word: "step N: " with no metric, an empty row in the CSV
        raise ValueError("trainer.limit_val_batches=0 validates nothing (tinylm validate would report no metric); "
                         "leave it out (the run's own data.val_batches), or pass a number of batches, e.g. "
                         "--trainer.limit_val_batches 20")
    if subcommand in ("fit", "validate") and runs:
        _check_processes(trainer_cfg, subcommand)
    if subcommand == "fit":
        _check_fit_limits(trainer_cfg if not own_steps or trainer_cfg.get("max_steps") not in (None, -1)
                          else {**trainer_cfg, "max_steps": 1})  # (a stand-in: the limits, not the count, to check)
        if runs:
            check_validation_interval(trainer_cfg)


def _check_fit_limits(trainer_cfg: dict[str, Any]) -> None:
    """What a fit runs for: steps (required), never epochs or a share of Lightning's batches."""
    max_steps = trainer_cfg.get("max_steps", -1)
    if max_steps in (None, -1):  # Lightning's default: no config given, or one without it
        from tinylm.cli.config_files import RECIPES

        # (outside a clone of the repo there is no configs/: a pip install has the recipes inside the package)
        where = "" if Path("configs").is_dir() or not RECIPES.is_dir() else f"; installed with tinylm in {RECIPES}"
        raise ValueError("trainer.max_steps is not set (tinylm runs are driven by steps): pass --config "
                         f"configs/NAME.yaml (a recipe{where}), or --trainer.max_steps N")
    if max_steps <= 0:
        raise ValueError(f"trainer.max_steps must be > 0, got {max_steps}; tinylm runs are driven by steps")
    if trainer_cfg.get("overfit_batches") not in (None, 0, 0.0):
        raise ValueError(f"trainer.overfit_batches={trainer_cfg['overfit_batches']} is not supported by tinylm "
                         "(its loader draws windows by step and cannot be re-instantiated by Lightning); to "
                         "see a model overfit, train on a tiny corpus: --data.corpus FILE of a few hundred "
                         "characters")
    limit = trainer_cfg.get("limit_train_batches")
    if limit in (0, 0.0):  # Lightning then ends the run at step 0 without a word
        raise ValueError("trainer.limit_train_batches=0 trains nothing (the run would end at step 0); "
                         "leave it out: tinylm runs are driven by --trainer.max_steps")
    if limit == 1 and isinstance(limit, int):  # (== 1.0, let through below) an epoch of one batch: Lightning steps
        # the optimizer at each epoch's end, so under accumulate_grad_batches 2 every micro-batch stepped alone
        raise ValueError("trainer.limit_train_batches=1 (a whole number) is one batch an epoch, not the whole epoch "
                         "(1.0), and Lightning steps the optimizer at every epoch's end, whatever "
                         "accumulate_grad_batches says; leave it out: tinylm runs are driven by --trainer.max_steps")
    if limit not in (None, 1.0):  # it cut the notional epochs shorter and the run trained the same steps
        raise ValueError(f"trainer.limit_train_batches={limit} changes nothing a tinylm run trains (its "
                         "batches are drawn by step, an epoch is a notional pass): the run would take the same "
                         "steps on the same windows; leave it out, and pass --trainer.max_steps N to train less")
    if trainer_cfg.get("max_epochs") not in (None, -1):
        raise ValueError("trainer.max_epochs is not used by tinylm (runs are driven by trainer.max_steps; an "
                         "epoch is a notional pass over random windows): remove it and set --trainer.max_steps")
    _check_stops(trainer_cfg, max_steps)


def _check_stops(trainer_cfg: dict[str, Any], max_steps: int) -> None:
    """min_steps and max_time that contradict a run of max_steps: Lightning trained on with no word of it."""
    min_steps = trainer_cfg.get("min_steps")
    if isinstance(min_steps, int) and min_steps > max_steps:  # Lightning then ignores the final step's stop
        raise ValueError(f"trainer.min_steps {min_steps} is above trainer.max_steps {max_steps}: the run ends at "
                         "max_steps anyway, without its final validation and best.ckpt; leave min_steps out (or "
                         "at most max_steps)")
    max_time = trainer_cfg.get("max_time")
    if isinstance(max_time, dict):  # Lightning's Timer passes it to timedelta: `{sec: 1}` was its TypeError traceback
        try:
            max_time = timedelta(**max_time)
        except TypeError:
            raise ValueError(f"trainer.max_time {trainer_cfg['max_time']} names what timedelta does not take; use "
                             "days, hours, minutes and seconds, e.g. {hours: 2}") from None
    zero = (all(p.strip().isdigit() and int(p) == 0 for p in max_time.split(":")) if isinstance(max_time, str)
            else isinstance(max_time, timedelta) and max_time <= timedelta(0))
    if zero:  # the run stopped at step 0 and said that last.ckpt was saved there (there was nothing to save)
        raise ValueError(f"trainer.max_time {trainer_cfg['max_time']} is no time: the run would stop before its "
                         "first step; pass a positive time (DD:HH:MM:SS, e.g. 00:01:00:00) or leave it out")


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
    if any(AcceleratorRegistry[n]["accelerator"].is_available()
           for n in (("cuda", "mps") if name == "gpu" else (name,))):
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


def check_devices(trainer_cfg: dict[str, Any], *, on_cpu: bool) -> None:
    """trainer.devices is a number of devices, -1 (every GPU), auto or a list of GPU indices; ``on_cpu`` (a run
    that trains there, or `tinylm plan`'s CPU plan), a number of processes. Lightning's CPU parser raised a bare
    TypeError ("`devices` selected with `CPUAccelerator` should be an int > 0.") with its traceback for `two`, -3,
    1.5 or a list."""
    devices = trainer_cfg.get("devices")
    if devices is None:
        return
    text = str(devices).strip().lower()
    if isinstance(devices, (list, tuple)) or re.fullmatch(r"\d+ *(, *\d+ *)*,? *", text) and "," in text:  # "0,1"
        indices = (list(devices) if isinstance(devices, (list, tuple))
                   else [int(d) for d in text.split(",") if d.strip()])
        if on_cpu:
            raise ValueError(f"trainer.devices {indices} lists GPU indices, and this run is on the CPU; pass "
                             f"the number of training processes instead: --trainer.devices {max(len(indices), 1)}")
        return
    if text == "auto" or re.fullmatch(r"[1-9]\d*", text) or text == "-1" and not on_cpu:
        return
    shown = text if re.fullmatch(r"-?\d+", text) else repr(devices)
    if text == "-1":  # (valid on GPUs: the same sentence offered it as valid)
        raise ValueError("trainer.devices -1 means every GPU, and this run is on the CPU, where it is the number "
                         "of training processes: pass --trainer.devices 1 (or auto)")
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
    cores = usable_cpus()
    if devices > cores:
        warnings.warn(f"--trainer.devices {devices} starts {devices} training processes on a CPU with {cores} "
                      f"cores: they take turns on the cores, so a step is no faster than on {cores} (each waits for "
                      "the slowest at every gradient all-reduce), and each holds its own model, optimizer and data "
                      f"loader in memory; use --trainer.devices {cores} or fewer (a larger --data.batch_size keeps "
                      "the global batch)")


def _check_processes(trainer_cfg: dict[str, Any], subcommand: str) -> None:
    """The strategy and nodes of a command that runs as configured (fit, validate)."""
    check_strategy(trainer_cfg)
    nodes, devices = trainer_cfg.get("num_nodes"), _devices_per_node(trainer_cfg)
    if str(trainer_cfg.get("strategy")).lower() == "single_device" and (devices or 1) * (nodes or 1) > 1:
        # Lightning then trained in one process without a word
        raise ValueError(f"trainer.strategy 'single_device' trains in one process, and trainer.devices {devices} x "
                         f"trainer.num_nodes {nodes or 1} asks for {(devices or 1) * (nodes or 1)}; pass "
                         "--trainer.strategy ddp (or fsdp) for several, or --trainer.devices 1")
    backend = trainer_cfg.get("strategy.init_args.process_group_backend")
    if isinstance(backend, str) and backend.lower() == "nccl" and _on_cpu(trainer_cfg):  # (two tracebacks)
        raise ValueError("trainer.strategy's process_group_backend 'nccl' connects CUDA GPUs, and this run is on "
                         "the CPU; pass --trainer.strategy.init_args.process_group_backend gloo, or leave it out "
                         "(Lightning picks the device's)")
    if isinstance(nodes, int) and nodes > 1:
        check_nodes(nodes, subcommand)
    check_launched_processes(trainer_cfg.get("num_nodes") or 1, _devices_per_node(trainer_cfg))


def check_validation_interval(trainer_cfg: dict[str, Any]) -> None:
    """A validation interval that a run of these options can keep: whole batches, at optimizer-step boundaries."""
    every, accumulate = trainer_cfg.get("val_check_interval"), trainer_cfg.get("accumulate_grad_batches")
    if (seconds := _seconds(every)) is not None and seconds <= 0:  # (0 batches is refused as not > 0 already)
        raise ValueError(f"trainer.val_check_interval {every} is no time: Lightning would validate after every "
                         "batch; pass a positive time (DD:HH:MM:SS, e.g. 00:00:30:00) or a number of batches")
    if isinstance(every, float) and every > 1 and every.is_integer():  # 1e3: read as a float, a share to Lightning
        raise ValueError(f"trainer.val_check_interval={every} is a float (1e3 or 500.0 is read as one), which "
                         f"Lightning takes as a fraction of an epoch; write it as {int(every)} (batches): "
                         f"--trainer.val_check_interval {int(every)}")
    if isinstance(every, float) and trainer_cfg.get("check_val_every_n_epoch") is None:  # Lightning needs it then
        raise ValueError(f"trainer.val_check_interval={every} is a fraction of an epoch, and tinylm's epochs are "
                         "notional (random windows, driven by max_steps); give a number of batches (e.g. "
                         "--trainer.val_check_interval 500) or a time (00:00:30:00)")
    whole = isinstance(every, int) and not isinstance(every, bool)  # batches; else a time
    # (a validation could fall between two micro-batches; not at 1.0, each epoch's end: a whole number of optimizer
    # steps, as tinylm's notional epochs are; 1, an int, is one batch)
    if every is not None and isinstance(accumulate, int) and accumulate > 1 and \
            not (whole and every % accumulate == 0) and not (isinstance(every, float) and every == 1.0):
        below = every - every % accumulate if whole else 0
        nearest = f"{below} or {below + accumulate}" if below else f"{accumulate} (or a multiple)"
        if whole and every * accumulate not in (below, below + accumulate):  # as a resume that trades devices for
            # accumulation and keeps the run's interval would mean: it counts micro-batches
            nearest += f", or {every * accumulate} to validate every {every} optimizer steps (it counts micro-batches)"
        what = "(batches) is not a multiple of" if whole else \
            "(a share of an epoch) under" if isinstance(every, float) else "(a time) under"
        raise ValueError(f"trainer.val_check_interval={every} {what} "
                         f"trainer.accumulate_grad_batches={accumulate}: validation would run inside an "
                         f"optimizer step, and a best.ckpt saved there could not be resumed exactly (its "
                         f"accumulated gradients are not saved); use --trainer.val_check_interval {nearest}")


def _seconds(value: Any) -> float | None:
    """The seconds of a time as Lightning reads val_check_interval's (DD:HH:MM:SS, timedelta's keywords, a
    timedelta), or None for another value."""
    if isinstance(value, dict):
        try:
            value = timedelta(**value)
        except TypeError:
            return None
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) == 4 and all(re.fullmatch(r"\s*-?\d+\s*", part) for part in parts):
        days, hours, minutes, seconds = (int(part) for part in parts)
        value = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return value.total_seconds() if isinstance(value, timedelta) else None


def _devices_per_node(trainer_cfg: dict[str, Any]) -> int | None:
    """How many processes a node runs for `trainer.devices` (as Lightning resolves it: auto and -1 are one process on
    the CPU, every GPU on a GPU); None where that is not known here."""
    import torch

    devices = trainer_cfg.get("devices")
    text = "auto" if devices is None else str(devices).strip().lower()
    if isinstance(devices, (list, tuple)) or "," in text:
        return len(devices) if isinstance(devices, (list, tuple)) else len([d for d in text.split(",") if d.strip()])
    if text.isdigit():
        return int(text)
    if text in ("auto", "-1"):
        return 1 if _on_cpu(trainer_cfg) else torch.cuda.device_count() or None
    return None


def with_atomic_checkpoints(plugins: Any) -> list:
    """The user's plugins plus tinylm's atomic CheckpointIO, unless they bring a CheckpointIO of their own."""
    from lightning.pytorch.plugins.io import CheckpointIO

    from tinylm.train.checkpoint_io import AtomicCheckpointIO

    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, CheckpointIO) for p in plugins):
        log.warning("--trainer.plugins brings its own CheckpointIO: tinylm's atomic checkpoint writes are off")
        return plugins
    return plugins + [AtomicCheckpointIO()]


_OWN_CALLBACKS = {"StabilityGuard": "--guard.* (on by default; --guard.enabled false turns it off)",
                  "SampleText": "--samples.* (--samples.every_n_steps N)", "EvalTasks": "--eval.* (--eval.tasks ...)"}
"""tinylm's callbacks that `--help` lists as options of their own: added again by hand, Lightning found two of them
("Found more than one stateful callback") in a traceback. The others are always on."""
_METRICS = ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_sec", "train/mfu", "train/muon_lr",
            "train/skipped_steps", "val/loss", "val/ppl", "val/bpb")
_REFUSED_CALLBACKS = {
    "GradientAccumulationScheduler": "set --trainer.accumulate_grad_batches N instead: tinylm's checks (validation "
                                     "at whole optimizer steps, exact resume) and its tokens per step read that, and "
                                     "a schedule would change the batch under them mid-run",
    "Timer": "set --trainer.max_time DD:HH:MM:SS instead (Lightning's Timer with that duration)",
    # (the LR it found went to the checkpoint's hyperparameters, not the optimizer, and a resume ran it again; the
    # batch size finder's trial fits ended in a refusal of the run's own batch size)
    "LearningRateFinder": "run `tinylm lr-find --config ...` first (it sweeps the run's own model and schedule), then "
                          "pass its --model.lr",
    "BatchSizeFinder": "set --data.batch_size (with --trainer.accumulate_grad_batches for the global batch); `tinylm "
                       "plan` says the memory a batch size takes",
    # (it swapped the run's schedule for SWALR, averaged once per notional epoch, and put the average into the model
    # at on_train_end, after the run's last save: no checkpoint held it)
    "StochasticWeightAveraging": "it averages once per epoch (tinylm's are notional: hundreds of steps), replaces the "
                                 "run's LR schedule with SWALR, and puts the average into the model only after the "
                                 "run's last checkpoint (best.ckpt and last.ckpt never hold it); use "
                                 "--trainer.callbacks+=EMAWeightAveraging (an average of every step, which the "
                                 "checkpoints hold)",
    # (it freezes pl_module.backbone at setup: TinyLM has none, and the run ended in an AttributeError traceback)
    "BackboneFinetuning": "it unfreezes a model's `backbone` module, and tinylm's GPT has none; to fine-tune, start a "
                          "new run from a checkpoint's weights with --model.init_from PATH (and a lower --model.lr)",
}


def refused_callback(name: str) -> str | None:
    """Why tinylm does not take Lightning's callback ``name`` (a class name), or None. Also asked of a parse error
    (tinylm.cli.errors): a callback whose arguments jsonargparse wants asked for them first (the scheduling of a
    GradientAccumulationScheduler), and was refused only once given them."""
    return f"--trainer.callbacks+={name} is not taken by tinylm: {_REFUSED_CALLBACKS[name]}" \
        if name in _REFUSED_CALLBACKS else None


def check_callbacks(callbacks: Any) -> None:
    """The user's ``--trainer.callbacks`` that would fail deep in a run (or train other than the run says), refused
    in one line before anything is made: tinylm's own callbacks added again, a schedule of accumulation, a Timer
    (its interval enum cannot be written into the run's config), and a monitor that is tinylm's metric with its
    slash written otherwise (`val_loss`, Lightning's habit: EarlyStopping ended in a traceback at the first
    validation)."""
    for cb in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else []:
        path = (cb.get("class_path") if hasattr(cb, "get") else None) or type(cb).__module__ + "." + type(cb).__name__
        name = str(path).rpartition(".")[2]
        if name in _OWN_CALLBACKS or (str(path).startswith("tinylm.") and name != "ProgressBar"):
            where = _OWN_CALLBACKS.get(name, "nothing: it is always on")
            raise ValueError(f"--trainer.callbacks+={name}: tinylm adds its {name} to every run itself; set it with "
                             f"{where}")
        if (refused := refused_callback(name)) is not None:
            raise ValueError(refused)
        args = cb.get("init_args") if hasattr(cb, "get") else None
        monitor = args.get("monitor") if hasattr(args, "get") else getattr(cb, "monitor", None)
        # only tinylm's name with its slash written otherwise (val_loss, val.loss): a metric of the user's own
        # (train/loss_ema, logged by their callback) is theirs to name, and a missing one is Lightning's one line
        meant = re.sub(r"[_.\-]", "/", monitor, count=1) if isinstance(monitor, str) and "/" not in monitor else None
        if meant in _METRICS:
            raise ValueError(f"--trainer.callbacks.monitor {monitor}: tinylm logs no such metric; did you mean "
                             f"{meant}? (its metrics: {', '.join(_METRICS)}, see docs/training.md)")


def check_checkpoint_names(callbacks: Any, folder: Path, *, logger: Any = None) -> None:
    """A user's ModelCheckpoint writing into the run's own checkpoints ``folder`` under a name tinylm writes there
    (best, last, step-N; or its save_last): one would overwrite the other's file without a word (a user's best.ckpt of
    the highest val/loss was replaced by tinylm's of the lowest). Without a dirpath it writes there too when
    ``logger`` (trainer.logger) is false: Lightning's default is then ``<default_root_dir>/checkpoints``."""
    for cb in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else []:
        if not hasattr(cb, "get") or not str(cb.get("class_path", "")).endswith("ModelCheckpoint"):
            continue
        args = cb.get("init_args") or {}
        dirpath, filename = args.get("dirpath") or (str(folder) if logger is False else None), args.get("filename")
        if dirpath:
            _check_not_in_another_run(str(dirpath), folder.parent)
        if not dirpath or Path(str(dirpath)).expanduser().resolve() != folder.resolve():
            continue
        named = "{}=0" if args.get("auto_insert_metric_name", True) is not False else "0"  # ("{step}": "step=4")
        formatted = re.sub(r"\{([^}:]*)[^}]*\}", lambda m, named=named: named.format(m[1]), str(filename or ""))
        taken = re.fullmatch(r"(best|last|step-\d+)(\.ckpt)?", formatted) if filename else None
        if taken or args.get("save_last"):
            what = f"filename {filename}" if taken else "save_last (last.ckpt)"
            said = f"--trainer.callbacks.dirpath {dirpath}" if args.get("dirpath") else \
                f"a ModelCheckpoint without a dirpath (with trainer.logger false: {dirpath})"
            raise ValueError(f"{said} is this run's own checkpoints folder, and its "
                             f"{what} is a name tinylm writes there: the two would overwrite each other; give your "
                             "ModelCheckpoint another --trainer.callbacks.filename (e.g. 'top-{step}') or dirpath")


def _check_not_in_another_run(dirpath: str, run_dir: Path) -> None:
    """A user's ModelCheckpoint whose dirpath is inside another run's folder (a branch, or a resume from a
    checkpoint alone, taking the run's config with its callbacks): Lightning restores its top-k there and deletes
    that run's checkpoints as better ones come."""
    from tinylm.cli.run_folder import holds_run

    where = Path(dirpath).expanduser().resolve()
    mine = run_dir.expanduser().resolve()
    for folder in (where, *where.parents):
        if folder == mine or mine in folder.parents:
            return  # this run's own folder (or one that holds it)
        if holds_run(folder):
            raise ValueError(f"--trainer.callbacks.dirpath {dirpath} is inside the folder of another run, {folder}: "
                             "this run's ModelCheckpoint would keep its top-k there and delete that run's "
                             f"checkpoints; pass a dirpath of this run's (e.g. {run_dir / 'topk'}), or leave it "
                             "unset")


def check_exception_checkpoints(callbacks: list, ckpt_path: str | None) -> None:
    """A user's OnExceptionCheckpoint whose checkpoint is there (a run that failed saved it: a file, or an FSDP2
    folder): Lightning starts a run given no ``ckpt_path`` from it (with such a callback, ``fit(ckpt_path=None)``
    means "last", the newest of that checkpoint and of a ModelCheckpoint's last*.ckpt: a fresh tinylm run silently
    became a resume of the other one) and deletes it when the run ends. A fresh run is refused in one line, as one
    that such a "last" of a user's ModelCheckpoint would start; a resume from another checkpoint is warned that the
    failed run's checkpoint goes at its end."""
    from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

    keepers = [cb for cb in callbacks if isinstance(cb, OnExceptionCheckpoint)]
    if not keepers:
        return
    given = Path(ckpt_path).resolve() if ckpt_path else None
    for cb in keepers:
        path = Path(cb.ckpt_path)
        if not path.exists() or path.resolve() == given:
            continue
        if given is not None:
            log.warning("%s, the checkpoint a run saved as it failed (OnExceptionCheckpoint), is deleted by Lightning "
                        "when this run ends; move it away to keep it", path)
            continue
        raise ValueError(f"--trainer.callbacks OnExceptionCheckpoint: {path} holds the checkpoint a run saved as it "
                         "failed, and Lightning would start this fresh run from it (and delete it at the end); go "
                         f"on from it with --ckpt_path {path} (under a new --run.name if its run's folder is there), "
                         "or move it away (or give the callback another --trainer.callbacks.dirpath)")
    for cb in callbacks if given is None else []:
        folder = Path(cb.dirpath) if isinstance(cb, ModelCheckpoint) and cb.dirpath else None
        lasts = sorted(p for p in folder.iterdir() if ModelCheckpoint.CHECKPOINT_NAME_LAST in p.name) \
            if folder is not None and folder.is_dir() else []
        if lasts:
            raise ValueError(f"--trainer.callbacks.dirpath {cb.dirpath} holds {lasts[-1].name}, and with an "
                             "OnExceptionCheckpoint Lightning would start this fresh run from it; resume with "
                             f"--ckpt_path {lasts[-1]}, or give the ModelCheckpoint another dirpath")


def warn_gpu_recipe_on_cpu(trainer_cfg: dict[str, Any], hparams, dm) -> None:
    """A GPU recipe (a wide model, with compile and many loader workers) run on a CPU takes minutes per step: say so
    once, with the fix, instead of leaving the user to wonder (shakespeare-char.yaml ran at ~75 s/step on 2 cores)."""
    if not _on_cpu(trainer_cfg):  # (auto on a Mac is MPS, Lightning's pick there: no CPU to warn about)
        return
    slow = []
    flops = 6 * hparams["n_layer"] * 12 * hparams["n_embd"] ** 2 * getattr(dm, "batch_size", 1) * hparams["block_size"]
    if flops > 5e11:  # ~6 N B T > 0.5 TFLOP per micro-batch: seconds per step on a laptop CPU
        # (compile on its own is no GPU sign: the laptop recipe compiled: ~45 s, then faster steps)
        if hparams.get("compile_model"):
            slow.append("model.compile_model true (minutes of compilation)")
        slow.append(f"a {hparams['n_layer']}-layer, {hparams['n_embd']}-wide model on batches of "
                    f"{getattr(dm, 'batch_size', '?')} x {hparams['block_size']} tokens")
    if slow and getattr(dm, "num_workers", 0) > 0:  # on their own, a few workers are fine on a CPU
        slow.append(f"data.num_workers {dm.num_workers} (workers compete with training for the cores)")
    if slow:
        warnings.warn("this recipe is sized for a GPU and will be very slow on this CPU: " + "; ".join(slow)
                      + ". For a laptop use configs/shakespeare-char-cpu.yaml (or override those options)")


def warn_fp16_weights(trainer_cfg: dict[str, Any]) -> None:
    """16-true holds the weights and the optimizer's states in fp16: AdamW's second moments of small gradients
    underflow (below ~6e-8) and the updates blow up. A 2-layer model that trains under 32-true and bf16-true diverged
    in 5 steps (loss 5.6 -> 20, grad norm 1 -> 370), and the health monitor then blames the LR, clipping or data.
    bf16-true holds the weights in bf16 (8 significant bits): an update below ~1/256 of a weight rounds away, so at the
    shipped LRs (1e-3 and below) the norm gains (1.0) never move and the rest learns less as the LR decays (a 20-step
    run at lr 1e-3: every gain still exactly 1.0, each moved by ~0.01 under 32-true), with nothing said."""
    precision = str(trainer_cfg.get("precision"))
    if precision == "16-true":
        warnings.warn("trainer.precision 16-true keeps the weights and the AdamW/Muon states in fp16, where small "
                      "second moments underflow and the updates blow up (runs diverge within a few steps); use "
                      "16-mixed (fp32 weights, fp16 matmuls) or bf16-mixed")
    elif precision == "bf16-true":
        warnings.warn("trainer.precision bf16-true keeps the weights in bf16, where an update below ~1/256 of a "
                      "weight rounds away: at an LR under ~2e-3 the norm gains (1.0) never move and the other "
                      "weights lose their small updates; use bf16-mixed (fp32 weights, bf16 matmuls)")


def warn_small_vocab(dm, resumed: bool = False) -> None:
    """A trained BPE far below the requested size (a small corpus) is worth a line at fit time, not only in
    `prepare`: the model's embedding is sized by the real vocabulary. Not on a resume: the run's tokenizer is the
    one it goes on with (its start said it)."""
    if dm is None or resumed or getattr(dm, "tokenizer_spec", None) not in ("bpe", "scratch-bpe"):
        return
    got, wanted = dm.vocab_size, dm.target_vocab_size
    if got < 0.9 * wanted:
        warnings.warn(f"the {dm.tokenizer_spec} tokenizer has {got:,} ids, far below --data.vocab_size {wanted:,}: "
                      "the corpus is too small (or repetitive) for that many merges; the model uses "
                      f"{got:,}. Use a bigger corpus or a smaller --data.vocab_size to silence this")


def device_count(opts: dict[str, Any]) -> int:
    """Devices of the run (all nodes): ``devices`` as an int, a list, "2" or "auto"/-1 (one per GPU here, else 1);
    checked by `check_trainer_options`."""
    import torch

    devices = opts.get("devices", "auto")
    number = int(devices) if str(devices).strip().lstrip("-").isdigit() else None
    if isinstance(devices, (list, tuple)):
        n = len(devices)
    elif number is not None and number > 0:
        n = number
    elif "," in str(devices):
        n = len([d for d in str(devices).split(",") if d.strip()])
    else:  # "auto" / -1: every GPU of this machine, or one process on a CPU
        n = max(torch.cuda.device_count(), 1)
    return n * int(opts.get("num_nodes") or 1)


def precision_plugin(plugins: Any) -> bool:
    """Whether ``--trainer.plugins`` holds a Precision plugin (which is the run's precision)."""
    from lightning.pytorch.plugins.precision import Precision

    return any(isinstance(p, Precision) for p in (plugins if isinstance(plugins, (list, tuple)) else [plugins]))
