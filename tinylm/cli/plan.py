"""`tinylm plan`: what a run will cost, from its fit config, before it runs."""

from __future__ import annotations

from pathlib import Path

from tinylm.studies.plan import CHINCHILLA_TOKENS_PER_PARAM, Memory, Plan
from tinylm.studies.plan import short_count as _n

DEFAULT_GPU = "H100"  # the GPU a plan answers for when the config's is not here (and beside every CPU plan)
SMALL_STEP_S = 1e-3  # a GPU step of fewer seconds of FLOPs than this is said to be launch-bound


def plan(fit_args: list[str], /, *, gpu: str | None = None, mfu: float = 0.4, json: bool = False,
         out: str | None = None) -> Plan:
    """Plan a run without training: parameters, FLOPs, tokens, Chinchilla's compute-optimal size, memory per device
    (with and without activation checkpointing) and wall time. Takes every `tinylm fit` option (--config FILE,
    --model.*, --data.*, --trainer.*, --print_config: see tinylm fit --help) plus the options below. The model is
    counted on the meta device (no weights are made, at any size); its vocabulary comes from the tokenizer where it
    can be had here (tiktoken's own sizes, a trained tokenizer's files), else from data.vocab_size (a line says so).

    Args:
        gpu: Device to plan for. Unset: the one the config runs on: with trainer.accelerator cpu (or auto on a
            machine without CUDA) this CPU, timed now (a matmul, and ~1 s of the real model's training steps when
            it is small: the load of other jobs counts, as it would in the run), with the GPU plan beside it; a GPU
            accelerator plans for this machine's GPU (H100 where there is none). A GPU name (H100, H200, B200, A100,
            L4, 4090, MI300X, ..., or a full device name such as "NVIDIA H100 80GB HBM3"): its dense peak FLOP/s at
            the run's precision x --mfu gives the wall time, and an unset trainer.precision means what fit picks
            there (bf16-mixed; 16-mixed on a V100, T4, ... without bf16). `cpu`: this CPU, as above.
        mfu: Model FLOPs utilisation to assume on a GPU (0.3-0.5 is typical for a well-tuned GPT on one GPU), and
            on a CPU for a model too large to time (its matmul rate x mfu).
        json: Print the plan as JSON instead of a table.
        out: Also draw the plan into this PNG: memory per device as stacked bars without and with activation
            checkpointing (a line at the GPU's memory when --gpu states it, as in "NVIDIA H100 80GB HBM3"), and the
            run's parameters and tokens against Chinchilla's compute-optimal frontier, with the plan's numbers (as
            --json prints them) in a .json beside it (default: no picture). As lr-find and scaling, it replaces its
            own earlier PNG and .json, and refuses a PNG whose .json beside is another command's or another file.
    """
    import json as jsonlib

    from tinylm.cli.fit_config import fit_objects
    from tinylm.device import gpu_names, known_gpu
    from tinylm.paths import check_json_beside
    from tinylm.ranges import check_ranges
    from tinylm.studies.plots import check_png_path

    check_ranges("--", {"mfu": mfu}, {"mfu": "(0, 1]"})
    if gpu is not None and gpu.lower() != "cpu" and not known_gpu(gpu):
        raise ValueError(f"--gpu {gpu!r} is not a GPU whose peak FLOP/s tinylm knows; use one of "
                         f"{', '.join(gpu_names())}, a full device name containing one (as nvidia-smi prints it), "
                         "or cpu")
    if out is not None:
        check_png_path(out)  # before the tokenizer is trained or loaded, which can take a while
        check_json_beside(out, "chinchilla_flops", "plan")  # lr-find's lr.json beside --out lr.png: refused
    cli = fit_objects(fit_args, meta=True)
    result, on_gpu = _make_plan(cli, gpu, mfu)
    print(jsonlib.dumps(result.as_dict(), indent=2) if json else format_plan(result, cli.model.hparams, on_gpu))
    if out is not None:
        hp = cli.model.hparams
        title = (f"{cli.run_dir.name}: {hp.n_layer} layers x {hp.n_embd} wide, micro-batch "
                 f"{cli.datamodule.batch_size} x context {hp.block_size}, {result.devices} x {result.gpu}")
        path = _write_plot(result, out, title)
        if not json:  # stdout stays one JSON document
            print(f"wrote {path} and {path.with_suffix('.json')}")
    return result


def _device_of(gpu: str | None, accelerator: object) -> str:
    """The device plan answers for: ``gpu`` when given, else the config's accelerator's (see plan's --gpu)."""
    import torch

    if gpu is not None:
        return gpu
    accelerator = str(accelerator or "auto").lower()
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return "cpu"
    return torch.cuda.get_device_name() if torch.cuda.is_available() else DEFAULT_GPU


def _make_plan(cli, gpu: str | None, mfu: float) -> tuple[Plan, Plan | None]:
    """(the plan on the config's device or ``gpu``, and for a CPU plan the same run on DEFAULT_GPU)."""
    from tinylm.cli.fit_config import trainer_options
    from tinylm.cli.trainer_checks import check_devices, device_count
    from tinylm.device import peak_flops_by_name
    from tinylm.studies.plan import plan as make_plan

    device = _device_of(gpu, dict(cli.config["fit"]["trainer"]).get("accelerator"))
    on_cpu = device.lower() == "cpu"
    opts = trainer_options(cli, gpu=None if on_cpu else device)
    if on_cpu:  # the devices as fit reads them there (-1 and GPU indices are refused, as fit refuses them)
        check_devices(opts, on_cpu=True)
        if str(opts.get("precision")) in ("16-mixed", "16"):  # Lightning trains it as bf16-mixed on a CPU (its
            opts["precision"] = "bf16-mixed"                   # warning says so): timed in fp16, it planned another
    max_steps = opts.get("max_steps")
    if not max_steps or max_steps < 1:
        raise ValueError(f"tinylm plan needs the run's length: set --trainer.max_steps N (got {max_steps})")
    hp = cli.model.hparams
    common = {"batch_size": cli.datamodule.batch_size, "accumulate": int(opts.get("accumulate_grad_batches") or 1),
              "devices": device_count(opts), "max_steps": int(max_steps), "mfu": mfu, "optimizer": hp.optimizer,
              "fsdp": "fsdp" in str(opts.get("strategy", "")).lower()}
    shape = cli.gpt_shape
    if not on_cpu:
        return make_plan(shape, precision=opts["precision"], gpu=device,
                         peak_flops=peak_flops_by_name(device, opts["precision"]), **common), None
    rate = _cpu_rate(cli, opts, mfu)
    result = make_plan(shape, precision=opts["precision"], gpu="cpu", peak_flops=None,
                       measured_flops=rate.flops_per_second, rate=f"{rate.threads} thread(s); {rate.how}", **common)
    gpu_opts = trainer_options(cli, gpu=DEFAULT_GPU)
    return result, make_plan(shape, precision=gpu_opts["precision"], gpu=DEFAULT_GPU,
                             peak_flops=peak_flops_by_name(DEFAULT_GPU, gpu_opts["precision"]), **common)


def _cpu_rate(cli, opts: dict, mfu: float):
    """This CPU's training rate for the run, with the threads fit would take now (tinylm.studies.cpu_rate)."""
    import torch

    from tinylm.device import busy_cpus, choose_cpu_threads
    from tinylm.studies.cpu_rate import measure

    threads, _ = choose_cpu_threads(cli.config_init["fit"]["run"].threads, busy=busy_cpus(0.1))
    torch.set_num_threads(threads)
    hp = cli.model.hparams
    clip = opts.get("gradient_clip_val")
    return measure(cli.gpt_shape.config, batch_size=cli.datamodule.batch_size, precision=opts["precision"],
                   optimizer=hp.optimizer, activation_checkpointing=bool(hp.activation_checkpointing),
                   clip=float(clip) if clip else None, mfu=mfu, prefix_len=hp.prefix_len)


def _write_plot(result: Plan, out: str, title: str) -> Path:
    """The PNG ``out`` and the plan's numbers in a .json beside it (as lr-find and scaling write theirs)."""
    import json

    from tinylm.errors import TinyLMError
    from tinylm.paths import replace_file
    from tinylm.studies.plan import memory_in_name, plot_plan

    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # (the numbers first: paths.check_json_beside)
        replace_file(Path(out).with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(result.as_dict(), indent=2)))
        return plot_plan(result, out, device_memory=memory_in_name(result.gpu), title=title)
    except OSError as e:  # a parent that is a file, a read-only folder, ...
        why = (f"{e.filename} is a file, not a folder" if isinstance(e, FileExistsError) else
               f"{e.strerror or e}: {e.filename}" if e.filename else e.strerror or str(e))
        raise TinyLMError(f"cannot write the plot to {out!r} ({why}); pass --out PATH.png in a writable folder"
                          ) from None


def _size(x: int) -> str:
    return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.1f} MiB"


def _duration(s: float) -> str:
    if s < 120:
        # (under 0.9995 s: 0.9996 s in milliseconds to 3 digits read "1e+03 ms")
        return f"{s * 1e3:.3g} ms" if s < 0.9995 else f"{s:.2g} s" if s < 10 else f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} days" if s < 63072000 else \
        f"{s / 31557600:.3g} years"


def _strategies(p: Plan) -> str:
    """Peak per device under each strategy on the run's devices, and the fastest that fits the GPU's memory."""
    from tinylm.studies.plan import fits_on, memory_in_name

    peaks = ", ".join(f"{name} {_size(peak)}" for name, peak in (p.strategies or {}).items())
    where = f"{p.devices} x {p.gpu}" + ("" if p.devices > 1 else " (FSDP2 shards over --trainer.devices N > 1)")
    capacity = memory_in_name(p.gpu)
    if capacity is None:
        return f"peak per device on {where}: {peaks} (--gpu \"NAME 80GB\" says which fits its memory)"
    best = fits_on(p, capacity)
    flags = {"FSDP2": "--trainer.strategy fsdp", "ckpt": "--model.activation_checkpointing true"}
    verdict = (f"the fastest that fits {_size(capacity)}: {best}" +
               (f" ({', '.join(flag for key, flag in flags.items() if key in best)})" if best != "DDP" else "")
               if best else f"none fits {_size(capacity)}: more devices, a smaller micro-batch (--data.batch_size, "
                            "--trainer.accumulate_grad_batches) or a smaller model")
    return f"peak per device on {where}: {peaks}; {verdict}"


def format_plan(p: Plan, hparams, on_gpu: Plan | None = None) -> str:
    under = p.tokens_per_param / CHINCHILLA_TOKENS_PER_PARAM
    verdict = ("about compute-optimal" if 0.5 <= under <= 2 else
               "past compute-optimal: a larger model on fewer tokens would reach a lower loss with these FLOPs "
               "(a small model trained long is still right when it will serve a lot)" if under > 2 else
               "undertrained for its size: a smaller model on more tokens would reach a lower loss with these FLOPs")

    ckpt = bool(getattr(hparams, "activation_checkpointing", False))  # which of the two rows the run is

    def mem(m: Memory) -> str:
        gathered = f" of which {_size(m.gathered)} gathered by FSDP2" if m.gathered else ""
        workspace = f", cuBLAS workspaces {_size(m.workspace)}" if m.workspace else ""
        return (f"{_size(m.peak)} peak  (weights {_size(m.weights)}{gathered}, gradients {_size(m.gradients)}, "
                f"optimizer {_size(m.optimizer)}, activations {_size(m.activations)}{workspace})")

    def wall(p: Plan) -> str:
        if p.measured_flops:
            return (f"{_duration(p.wall_seconds)} on this CPU, {_duration(p.step_seconds)} a step, at "
                    f"{p.measured_flops / 1e9:.3g} GFLOP/s ({p.rate})")
        if p.wall_seconds is None:
            return f"unknown: no peak FLOP/s for {p.gpu!r} at {p.precision} (try --gpu H100, A100, L4, ...)"
        at = f"on {p.devices} x {p.gpu} at {p.mfu:.0%} MFU ({p.peak_flops / 1e12:.0f} TFLOP/s dense peak each)"
        if p.step_seconds < SMALL_STEP_S:
            # a step of microseconds of FLOPs is bound by its hundreds of kernel launches and the Python around them
            # (the laptop recipe: 10 us of FLOPs a step on an H100), which no MFU describes
            return (f"{_duration(p.max_steps * SMALL_STEP_S)} or more: a model this small is bound by its kernel "
                    f"launches and Python (a millisecond or more a step), not by its FLOPs ({_duration(p.wall_seconds)}"
                    f" {at})")
        return f"{_duration(p.wall_seconds)} {at}"

    rows = [
        ("model", (f"{hparams.n_layer} layers x {hparams.n_embd} wide, {hparams.n_head} heads, "
                   f"context {hparams.block_size}, vocab {hparams.vocab_size:,}")),
        ("parameters", f"{_n(p.params)} total, {_n(p.non_embedding_params)} non-embedding"),
        ("FLOPs per token", f"{_n(p.flops_per_token)} (6 x the multiplying parameters + attention; fwd + bwd)"),
        ("tokens per step", f"{p.tokens_per_step:,} (micro-batch x accumulation x {p.devices} device(s) x context)"),
        ("tokens in the run", f"{_n(p.tokens)} ({p.max_steps:,} steps)"),
        ("FLOPs of the run", f"{p.run_flops:.3g} (FLOPs per token x tokens)"),
        ("tokens per parameter", (f"{p.tokens_per_param:.1f} (Chinchilla: ~{CHINCHILLA_TOKENS_PER_PARAM:.0f}): "
                                  f"{verdict}")),
        ("compute-optimal size", (f"{_n(p.optimal_params)} parameters on {_n(p.optimal_tokens)} tokens for this "
                                  f"run's C = 6ND = {p.chinchilla_flops:.3g} (N: all parameters)")),
        (f"memory per device ({p.precision})", mem(p.memory) + ("  (--model.activation_checkpointing false)"
                                                                  if ckpt else "  (this run)")),
        ("with activation ckpt", mem(p.memory_checkpointed) + ("  (this run)" if ckpt else
                                                                "  (--model.activation_checkpointing true)")),
        ("wall time", wall(p)),
    ]
    if on_gpu is not None:
        rows.append((f"on a GPU ({on_gpu.precision})", wall(on_gpu) + "  (--gpu NAME plans for another)"))
    else:
        rows.append(("strategies", _strategies(p)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
