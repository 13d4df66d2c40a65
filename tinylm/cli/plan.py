"""`tinylm plan`: what a run will cost, from its fit config, before it runs."""

from __future__ import annotations

from pathlib import Path

from tinylm.studies.plan import CHINCHILLA_TOKENS_PER_PARAM, Memory, Plan
from tinylm.studies.plan import short_count as _n


def plan(fit_args: list[str], /, *, gpu: str = "H100", mfu: float = 0.4, json: bool = False,
         out: str | None = None) -> Plan:
    """Plan a run without training: parameters, FLOPs, tokens, Chinchilla's compute-optimal size, memory per device
    (with and without activation checkpointing) and wall time on a GPU. Takes every `tinylm fit` option
    (--config FILE, --model.*, --data.*, --trainer.*, --print_config: see tinylm fit --help) plus the options
    below. The tokenizer is trained or loaded (its vocabulary sizes the model); nothing is trained.

    Args:
        gpu: GPU to plan for (H100, H200, B200, A100, L4, 4090, MI300X, ..., or a full device name such as
            "NVIDIA H100 80GB HBM3"): its dense peak FLOP/s at the run's precision gives the wall time, and an unset
            trainer.precision means what fit picks there: bf16-mixed (16-mixed on a V100, T4, ... without bf16).
            `cpu`: plan for this machine (its precision; no wall time).
        mfu: Model FLOPs utilisation to assume (0.3-0.5 is typical for a well-tuned GPT on one GPU).
        json: Print the plan as JSON instead of a table.
        out: Also draw the plan into this PNG: memory per device as stacked bars without and with activation
            checkpointing (a line at the GPU's memory when --gpu states it, as in "NVIDIA H100 80GB HBM3"), and the
            run's parameters and tokens against Chinchilla's compute-optimal frontier (default: no picture).
    """
    import json as jsonlib

    from tinylm.cli.fit_config import device_count, fit_objects, trainer_options
    from tinylm.device import gpu_names, known_gpu, peak_flops_by_name
    from tinylm.ranges import check_ranges
    from tinylm.studies.plan import plan as make_plan
    from tinylm.studies.plots import check_png_path

    check_ranges("", {"mfu": mfu}, {"mfu": "(0, 1]"})
    if gpu.lower() != "cpu" and not known_gpu(gpu):
        raise ValueError(f"--gpu {gpu!r} is not a GPU whose peak FLOP/s tinylm knows; use one of "
                         f"{', '.join(gpu_names())}, a full device name containing one (as nvidia-smi prints it), "
                         "or cpu")
    if out is not None:
        check_png_path(out)  # before the tokenizer is trained or loaded, which can take a while
    cli = fit_objects(fit_args)
    opts = trainer_options(cli, gpu=None if gpu.lower() == "cpu" else gpu)
    max_steps = opts.get("max_steps")
    if not max_steps or max_steps < 1:
        raise ValueError(f"tinylm plan needs the run's length: set --trainer.max_steps N (got {max_steps})")
    result = make_plan(
        cli.model.model, batch_size=cli.datamodule.batch_size, accumulate=int(opts.get("accumulate_grad_batches") or 1),
        devices=device_count(opts), max_steps=int(max_steps), precision=opts["precision"], gpu=gpu, mfu=mfu,
        peak_flops=peak_flops_by_name(gpu, opts["precision"]), fsdp="fsdp" in str(opts.get("strategy", "")).lower(),
        optimizer=cli.model.hparams.optimizer,
    )
    print(jsonlib.dumps(result.as_dict(), indent=2) if json else format_plan(result, cli.model.hparams))
    if out is not None:
        hp = cli.model.hparams
        title = (f"{cli.run_dir.name}: {hp.n_layer} layers x {hp.n_embd} wide, micro-batch "
                 f"{cli.datamodule.batch_size} x context {hp.block_size}, {result.devices} x {result.gpu}")
        path = _write_plot(result, out, title)
        if not json:  # stdout stays one JSON document
            print(f"wrote {path}")
    return result


def _write_plot(result: Plan, out: str, title: str) -> Path:
    from tinylm.errors import TinyLMError
    from tinylm.studies.plan import memory_in_name, plot_plan

    try:
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
        return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} days"


def format_plan(p: Plan, hparams) -> str:
    under = p.tokens_per_param / CHINCHILLA_TOKENS_PER_PARAM
    verdict = ("about compute-optimal" if 0.5 <= under <= 2 else
               "past compute-optimal: a larger model on fewer tokens would reach a lower loss with these FLOPs "
               "(a small model trained long is still right when it will serve a lot)" if under > 2 else
               "undertrained for its size: a smaller model on more tokens would reach a lower loss with these FLOPs")

    ckpt = bool(getattr(hparams, "activation_checkpointing", False))  # which of the two rows the run is

    def mem(m: Memory) -> str:
        return (f"{_size(m.peak)} peak  (weights {_size(m.weights)}, gradients {_size(m.gradients)}, optimizer "
                f"{_size(m.optimizer)}, activations {_size(m.activations)})")

    wall = (f"{_duration(p.wall_seconds)} on {p.devices} x {p.gpu} at {p.mfu:.0%} MFU "
            f"({p.peak_flops / 1e12:.0f} TFLOP/s dense peak each)" if p.wall_seconds is not None else
            f"unknown: no peak FLOP/s for {p.gpu!r} at {p.precision} (try --gpu H100, A100, L4, ...)")
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
        ("wall time", wall),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
