"""`tinylm lr-find`: the LR range test on a fit config, with the size-based rule of thumb beside it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path


def lr_find(fit_args: list[str], /, *, min_lr: float = 1e-6, max_lr: float = 1.0, num_training: int = 100,
            out: str | None = None) -> dict:
    """Find a learning rate: train num_training steps while the LR grows exponentially from min_lr to max_lr
    (Lightning's Tuner.lr_find; the weights are restored afterwards), plot loss against LR, and print the LR where
    the loss falls fastest per decade beside the rule of thumb 6e-4·(124M/N)^0.5. Takes every `tinylm fit` option
    (--config FILE, --model.*, --data.*, --trainer.*: see tinylm fit --help) plus the options below; runs on one device,
    its steps the run's global batch (the micro-batches of every device of the run, accumulated).

    Args:
        min_lr: LR of the first step.
        max_lr: LR of the last step (the test stops early once the loss exceeds 4x its best).
        num_training: Optimizer steps of the test (more gives a smoother curve).
        out: PNG to write, with the curve and suggestion as .json beside it (default: lr_find.png in the run's
            folder, <trainer.default_root_dir>/<run.name>/).
    """
    from tinylm.cli.fit_config import fit_objects, trainer_options
    from tinylm.cli.launch_checks import refuse_launched
    from tinylm.paths import check_json_beside
    from tinylm.ranges import check_ranges
    from tinylm.studies.lr_find import plot_lr_find
    from tinylm.studies.plots import check_png_path

    check_ranges("--", {"min_lr": min_lr, "max_lr": max_lr, "num_training": num_training},  # max_lr first: min_lr's
                 {"max_lr": "(0, inf)", "min_lr": "(0, max_lr)", "num_training": "[4, 10000]"},  # bound is max_lr;
                 whole=("num_training",))  # 4: three points to read past the last, which the suggestion skips
    if out:
        check_png_path(out)  # before the sweep, not after
        check_json_beside(out, "rule_of_thumb", "lr-find")
    refuse_launched("lr-find", "each would run the whole sweep and write the same lr_find.png")
    cli = fit_objects(fit_args, trains_here=True)
    path = Path(out) if out else cli.run_dir / "lr_find.png"
    if not out:  # the default too, before the sweep (a read-only run folder failed only once it was done)
        check_png_path(path)
        check_json_beside(path, "rule_of_thumb", "lr-find")
    result = _sweep(cli, trainer_options(cli), min_lr=min_lr, max_lr=max_lr, num_training=num_training)
    summary = {"suggestion": result.suggestion, "rule_of_thumb": result.rule_of_thumb,
               "config_lr": cli.model.hparams.lr, "seed_everything": cli.config["fit"].get("seed_everything"),
               "lrs": result.lrs, "losses": result.losses}
    # the numbers first: a picture without its .json beside it is taken for another file (paths.check_json_beside)
    path.parent.mkdir(parents=True, exist_ok=True)
    from tinylm.paths import replace_file

    replace_file(path.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(summary, indent=1)))
    path = plot_lr_find(result, path,
                        title=f"{cli.run_dir.name}: {cli.model.model.num_params() / 1e6:.2f}M parameters",
                        config_lr=cli.model.hparams.lr)
    _print_summary(result, cli.model.hparams, path)
    which = "" if result.suggestion else " (no suggestion: at the rule of thumb's LR)"
    print(f"next{which}:\n  {_next_command(fit_args, cli, result.suggestion or result.rule_of_thumb)}")
    return summary


def _sweep(cli, opts: dict, *, min_lr: float, max_lr: float, num_training: int):
    """The range test on one device, each step the run's global batch; a Ctrl+C ends it as every command's."""
    import tempfile

    import lightning as L

    from tinylm.cli.trainer_checks import check_fits_in_memory, device_count
    from tinylm.studies.lr_find import lr_find as range_test

    keep = ("accelerator", "precision", "gradient_clip_val")
    # the LR suits the global batch: on one device the sweep's step accumulates the micro-batches of every device
    # of the run (a run on 2 devices was swept at half its batch, and its LR suggested for that)
    devices, accumulate = device_count(opts), int(opts.get("accumulate_grad_batches") or 1)
    if devices > 1:
        print(f"the run trains on {devices} devices; the sweep, on one, accumulates {devices * accumulate} "
              f"micro-batches a step (accumulate_grad_batches {accumulate} x {devices}): the run's global batch")
    with tempfile.TemporaryDirectory() as tmp:  # Lightning's restore checkpoint lives here, not in the run folder
        trainer = L.Trainer(**{k: opts[k] for k in keep if opts.get(k) is not None}, devices=1, max_steps=num_training,
                            accumulate_grad_batches=devices * accumulate,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                            use_distributed_sampler=False, default_root_dir=tmp)
        check_fits_in_memory(trainer, cli.model, cli.datamodule.batch_size)  # as fit's: one line, not an OOM kill
        _set_cpu_threads(trainer, cli.config_init["fit"]["run"].threads)
        try:
            return range_test(trainer, cli.model, cli.datamodule, params=cli.model.model.num_params(),
                              min_lr=min_lr, max_lr=max_lr, num_training=num_training)
        except SystemExit as e:
            if isinstance(e.__context__, KeyboardInterrupt):  # Lightning ends a Ctrl+C in sys.exit(1), a failure:
                raise e.__context__ from None  # main() reports it as every command's Ctrl+C ("interrupted", 130)
            raise


def _set_cpu_threads(trainer, requested: int | None) -> None:
    """The sweep's torch threads on a CPU, chosen and said as fit's (`tinylm.device.choose_cpu_threads`): its own
    Trainer kept torch's every thread beside other jobs, and --run.threads did nothing, without a word."""
    if trainer.strategy.root_device.type != "cpu":
        return
    import logging

    import torch

    from tinylm.device import choose_cpu_threads

    threads, why = choose_cpu_threads(requested)
    torch.set_num_threads(threads)
    logging.getLogger("tinylm").info("CPU threads: %s", why)


def _next_command(fit_args: list[str], cli, lr: float) -> str:
    """The fit that trains what was swept at the suggested ``lr``: the sweep's own arguments, the data it read from
    the run its config names (`run_data`: a new run folder has no record to take them from), and a new run name
    where that folder already holds a run (a fresh fit there is refused)."""
    from tinylm.cli.argv import spans, spelled
    from tinylm.cli.run_folder import holds_run

    data = [arg for key, value in cli.run_data.items()
            for arg in spelled(f"data.{key}", value if isinstance(value, str) else json.dumps(value))]
    name = ["--run.name", _new_run_name(cli.run_dir, lr)] if holds_run(cli.run_dir) else []
    # seed_everything true drew a seed for the sweep: the fit starts from the weights swept, not another draw
    seed = ["--seed_everything", str(cli.config["fit"]["seed_everything"])] if getattr(cli, "seed_drawn", False) else []
    # the sweep's own --run.name L and --seed_everything true give way (it read `--run.name L --run.name L-lr2e-01`)
    replaced = {"run.name"} if name else set()
    replaced |= {"seed_everything"} if seed else set()
    fit_args = [a for key, _, span in spans(fit_args) for a in span if key not in replaced]
    hp = cli.model.hparams
    # the sweep moved Muon's LR at muon_lr / lr times lr (tinylm.studies.lr_find): keep that ratio at the suggestion,
    # or --model.lr 6e-2 alone would leave muon_lr at 0.02, a third of lr where the sweep had it at 20x
    said = float(f"{lr:.2e}")
    muon = f" --model.muon_lr {hp.muon_lr / hp.lr * said:.2e}" if hp.optimizer == "muon" else ""
    # the schedule's floor at the config's ratio to its peak: a suggestion below the config's min_lr made a fit
    # that was refused (min_lr must be in [0, lr]), and one just above it a cosine that barely decays
    floor = f" --model.min_lr {hp.min_lr / hp.lr * said:.2e}" if hp.min_lr > 0 else ""
    return f"tinylm fit {shlex.join([*fit_args, *data, *name, *seed])} --model.lr {lr:.2e}{floor}{muon}"


def _new_run_name(run_dir: Path, lr: float) -> str:
    """``<run>-lr<LR>`` beside ``run_dir``, numbered (``-2``, ``-3``, ...) past a folder that holds a run: a second
    sweep of the same config suggested the name its first next: fit had trained, and fit refused it."""
    from tinylm.cli.run_folder import holds_run

    base = f"{run_dir.name}-lr{lr:.0e}"
    taken = (run_dir.with_name(name) for name in (base, *(f"{base}-{k}" for k in range(2, 10_000))))
    return next(folder.name for folder in taken if not holds_run(folder))


def _print_summary(result, hparams, path: Path) -> None:
    said = f"{result.suggestion:.2e}" if result.suggestion else f"none ({result.why_none})"
    print(f"steepest descent (per decade of LR): {said}")
    print(f"rule of thumb 6e-4·(124M/N)^0.5:      {result.rule_of_thumb:.2e}")
    print(f"this config's model.lr:                {hparams.lr:.2e}")
    if hparams.optimizer == "muon":
        ratio = hparams.muon_lr / hparams.lr
        print(f"model.optimizer muon: swept model.lr with muon_lr at {ratio:g}x it (this config's ratio); for a "
              f"suggestion L, set model.lr L and model.muon_lr {ratio:g}·L (the fit below does)")
    print(f"wrote {path} and {path.with_suffix('.json')}")
