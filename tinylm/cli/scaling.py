"""`tinylm scaling`: a compute-matched ladder of ordinary tinylm runs, a scaling-law fit, and a checked prediction."""

from __future__ import annotations

import csv
import json as jsonlib
import logging
import math
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

# The ladder measured on the laptop recipe (tinyshakespeare, characters, --data.batch_size 64): one layer, widths 8 to
# 20 (2k to 9k parameters), all below the budget's compute-optimal size, so the loss still falls with size and the
# law predicted the 12k-parameter model within 0.006 nats (docs/benchmarks.md). Bigger rungs at this budget pass the
# optimum (~16-30k parameters on 1M characters) and the loss rises again.
DEFAULT_BUDGET = 2e12
DEFAULT_SIZES = ((1, 8), (1, 12), (1, 16), (1, 20))  # (n_layer, n_embd)
DEFAULT_PREDICT = (1, 24)
# what each rung's `fit` sets from --budget and the rung's size
_SET_PER_RUN = ("--model.n_layer", "--model.n_embd", "--model.n_head", "--trainer.max_steps", "--model.warmup_steps",
                "--model.decay_steps", "--trainer.val_check_interval")
# of those, the ones whose value a user gives is not used at all (the config's head size sets the rungs' n_head, its
# warmup_steps caps theirs)
_OVERRIDDEN = tuple(f for f in _SET_PER_RUN if f not in ("--model.n_head", "--model.warmup_steps"))


def scaling(fit_args: list[str], /, *, budget: float = DEFAULT_BUDGET, sizes: list[list[int]] | None = None,
            predict: list[int] | None = None, head_size: int | None = None, out: str | None = None) -> dict:
    """Train a compute-matched ladder (models of several sizes, each for the same training FLOPs), fit
    L(N) = E + A·N^-alpha to their final validation losses, find the compute-optimal size of the budget, then train
    a larger model and compare its loss with the law's prediction. Takes every `tinylm fit` option (--config FILE,
    --model.*, --data.*, --trainer.*: see tinylm fit --help) plus the options below.

    Every model is an ordinary tinylm run in its own folder (runs/<run.name>-C<budget>-L<layers>-d<width>: logged,
    checkpointed, resumable): rerunning the command resumes an interrupted run and reuses finished ones. Each
    warms up for the config's warmup_steps, at most a tenth of its steps, and decays over its own length. Text
    samples are off in these runs unless --samples.every_n_steps is given. The law holds below the budget's
    compute-optimal size: past it, at equal FLOPs, a bigger model sees too few tokens and its loss rises again.

    Args:
        budget: Training FLOPs per model (6N + attention per token, times tokens); each model's max_steps follows.
        sizes: The ladder as [[n_layer, n_embd], ...] (at least 3; default [[1,8],[1,12],[1,16],[1,20]], below
            the optimum for the laptop recipe at 2e12 FLOPs with --data.batch_size 64).
        predict: [n_layer, n_embd] of the larger model to predict and then train (default [1,24]).
        head_size: Channels per attention head; n_head = n_embd / head_size (default: the largest that divides
            the config's head size and every width, 4 for the defaults).
        out: PNG of the fit (default: <trainer.default_root_dir>/<run.name>-scaling-C<budget>-<every model>.png,
            e.g. ...-scaling-C2.0e12-L1-d8_L1-d12_L1-d16_L1-d20_L1-d24.png: another ladder does not overwrite it);
            the numbers go to a .json beside it.
    """
    from tinylm.cli.fit_config import fit_objects, trainer_options
    from tinylm.cli.ranks import rank_zero
    from tinylm.cli.trainer_checks import device_count
    from tinylm.studies.plots import check_png_path

    sizes = [tuple(s) for s in (DEFAULT_SIZES if sizes is None else sizes)]  # [] is not "unset": refused
    target = tuple(DEFAULT_PREDICT if predict is None else predict)  # ([] too is refused)
    _check_options(fit_args, budget, head_size, sizes, target, out)
    cli = fit_objects(fit_args, ladder=True)
    hp, opts = cli.model.hparams, trainer_options(cli)
    accumulate = int(opts.get("accumulate_grad_batches") or 1)
    tokens_per_step = cli.datamodule.batch_size * accumulate * device_count(opts) * hp.block_size
    rungs, shape = _rungs(sizes + [target], hp, head_size, budget, tokens_per_step)
    root, base = cli.run_dir.parent, cli.run_dir.name
    tag = f"C{budget:.1e}".replace("+", "")
    names = [f"{base}-{tag}-{r.label}" for r in rungs]
    settings = ladder_settings(cli.config["fit"].as_dict())
    _keep_recorded_seed(cli, [root / name for name in names], settings)  # (seed_everything true: a rerun)
    for r, name in zip(rungs, names):  # before training anything: a folder of another ladder is never mixed in
        check_ladder_run(root / name, r, shape, settings)
    out_path = Path(out) if out else root / f"{base}-scaling-{tag}-{'_'.join(r.label for r in rungs)}.png"
    check_png_path(out_path)  # the default too, before the ladder trains (without matplotlib: trained, then failed)
    # a ladder run's text samples cost time and show nothing the table does; a user who asks for them gets them
    no_samples = [] if any(a.startswith("--samples.every_n_steps") for a in fit_args) else \
        ["--samples.every_n_steps", "0"]
    # the data of the run the config names, where it holds one (tinylm.cli.fit_config): each rung reads it too
    data = [f"--data.{k}={v if isinstance(v, str) else jsonlib.dumps(v)}" for k, v in cli.run_data.items()]
    losses = _train_ladder(rungs, [root / name for name in names], [*fit_args, *data, *no_samples], accumulate)
    if not rank_zero():  # another rank of the ladder's runs (DDP's launcher re-ran this command): it trained them
        return {}
    result = _fit_ladder(rungs, losses, budget, tokens_per_step, out_path)
    print(format_scaling(result))
    from tinylm.cli.summary import shown

    print(f"next:\n  tinylm plot {' '.join(shown(root / name) for name in names)}")
    return result


def _check_options(fit_args: list[str], budget: float, head_size: int | None, sizes: list[tuple], target: tuple,
                   out: str | None) -> None:
    """The command's own options, before hours of training; the fit options it sets per run are named."""
    from tinylm.paths import check_json_beside
    from tinylm.ranges import check_ranges
    from tinylm.studies.plots import check_png_path

    check_ranges("--", {"budget": budget, "head_size": head_size}, {"budget": "(0, 1e24]", "head_size": "[1, inf)"})
    _check_sizes(sizes, target)
    if out:
        check_png_path(out)  # before hours of training, not after
        check_json_beside(out, "budget_flops", "scaling")
    set_per_run = [flag for flag in (a.split("=")[0] for a in fit_args) if flag in _OVERRIDDEN]
    if set_per_run:
        log.warning("scaling sets %s for each run (from --budget and the run's size); ignoring %s",
                    ", ".join(o[2:] for o in _OVERRIDDEN), " ".join(set_per_run))


def _check_sizes(sizes: list[tuple], target: tuple) -> None:
    if len(sizes) < 3 or any(len(s) != 2 for s in sizes + [target]):
        raise ValueError(f"--sizes needs at least 3 [n_layer, n_embd] pairs and --predict one pair, got "
                         f"{[list(s) for s in sizes]} and {list(target)}")
    if any(n < 1 for s in sizes + [target] for n in s):
        raise ValueError(f"--sizes and --predict need n_layer and n_embd >= 1, got {[list(s) for s in sizes]} and "
                         f"{list(target)}")
    if len(set(sizes + [target])) < len(sizes) + 1:
        raise ValueError(f"--sizes {[list(s) for s in sizes]} and --predict {list(target)} repeat a size; every "
                         "rung and the predicted model must differ")


def _rungs(sizes: list[tuple], hp, head_size: int | None, budget: float, tokens_per_step: int) -> tuple[list, dict]:
    """The ladder's runs (the predicted model last), each of the config's architecture at its size and trained for
    ``budget`` FLOPs; and that architecture (every GPTConfig option but the size)."""
    from tinylm.model.config import config_fields
    from tinylm.studies.scaling import rung

    # every architecture option of the config (positions, mlp, tied head, ...): they change N and the FLOPs
    shape = {k: hp[k] for k in config_fields("data", "arch", "run")}  # all but the size
    head = head_size or math.gcd(hp.n_embd // hp.n_head, *(n_embd for _, n_embd in sizes))
    if head_size is None and head < 4:  # [[1,7],[1,12],[1,16]]: gcd 1, one-channel heads
        raise ValueError(f"the widths of --sizes and --predict and the config's head size {hp.n_embd // hp.n_head} "
                         f"share no head size above {head}: their heads would have {head} channel(s); pass "
                         "--head_size N (dividing every width) or widths that share one (multiples of 4, say)")
    rungs = []
    for n_layer, n_embd in sizes:
        try:
            rungs.append(rung(n_layer=n_layer, n_embd=n_embd, head_size=head, budget=budget,
                              tokens_per_step=tokens_per_step, warmup_steps=hp.warmup_steps, **shape))
        except ValueError as e:  # a width the head size does not divide, an odd head size with RoPE, ...
            raise ValueError(f"ladder model [{n_layer}, {n_embd}] with head size {head}: {e}; or pass another "
                             "--head_size") from None
    short = [r for r in rungs if r.max_steps < 1]
    if short:
        raise ValueError(f"--budget {budget:g} buys {short[0].label} less than one step of {tokens_per_step:,} "
                         f"tokens ({short[0].flops_per_token * tokens_per_step:.3g} FLOPs); raise --budget")
    for r in rungs:  # whole steps: a rung of a few steps spends a budget that is off by up to half a step
        spent = r.max_steps * tokens_per_step * r.flops_per_token / budget
        if abs(spent - 1) > 0.05:
            log.warning("%s trains %d steps, %.0f%% of the budget's FLOPs (steps are whole): the ladder is not "
                        "compute-matched; raise --budget", r.label, r.max_steps, 100 * spent)
    return rungs, shape


def _train_ladder(rungs: list, run_dirs: list[Path], fit_args: list[str], accumulate: int) -> list[float]:
    """Each rung's final val/loss, training those not finished, saying "rung k of n" and, once one rung has trained,
    the ladder's time left (every rung spends the same FLOPs: the time per rung of the steps trained so far in this
    process, times the unfinished rungs; a rung resumed partway counts the share of its steps it trained)."""
    from tinylm.cli.summary import count, duration
    from tinylm.studies.scaling import ladder_time_left

    losses, spent, trained = [], 0.0, 0.0
    for k, (r, run_dir) in enumerate(zip(rungs, run_dirs), 1):
        unfinished = sum(final_val_loss(d, rr.max_steps) is None for rr, d in zip(rungs[k - 1:], run_dirs[k - 1:]))
        finished = final_val_loss(run_dir, r.max_steps) is not None
        left = ladder_time_left(spent, trained, unfinished)
        eta = ("" if left is None else
               f"; about {duration(left)} left for the ladder ({count(unfinished, 'run')} to train)")
        log.info("scaling: rung %d of %d: %s, %s parameters, %s steps%s%s", k, len(rungs), run_dir.name,
                 f"{r.params:,}", f"{r.max_steps:,}", " (finished before: reused)" if finished else "", eta)
        start_step = 0 if finished else _resume_step(run_dir, r.max_steps)
        started = time.perf_counter()
        losses.append(_train_rung(run_dir, r, fit_args, accumulate))
        if not finished:
            spent, trained = spent + time.perf_counter() - started, trained + (r.max_steps - start_step) / r.max_steps
    return losses


def _resume_step(run_dir: Path, max_steps: int) -> int:
    """The step an unfinished rung resumes from: its checkpoint's, or 0 (none, or one at max_steps without the final
    val/loss, which `_train_rung` sets aside to train again)."""
    from tinylm.checkpoint import load_checkpoint
    from tinylm.cli.resume import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    step = int(load_checkpoint(ckpt, mmap=True).get("global_step", 0)) if ckpt is not None else 0
    return step if step < max_steps else 0


def _train_rung(run_dir: Path, r, fit_args: list[str], accumulate: int) -> float:
    """The final val/loss of rung ``r`` in ``run_dir``: read back when the run finished before, else after training
    it (resuming it when it has a checkpoint)."""
    from tinylm.checkpoint import load_checkpoint
    from tinylm.cli.fit import lightning_main
    from tinylm.cli.ranks import rank_zero
    from tinylm.cli.resume import latest_checkpoint
    from tinylm.cli.run_folder import holds_run
    from tinylm.errors import TinyLMError
    from tinylm.train.interrupt import RunInterrupted, late_signal

    # every rank reads the same: the runs before this one finished before their ranks went on
    loss = final_val_loss(run_dir, r.max_steps)
    if loss is None:
        ckpt = latest_checkpoint(run_dir)
        # trained to its last step, its final val/loss not logged (validation or logging off, or killed as it
        # validated): a resume has no step left to train, and fit refuses it
        done = ckpt is not None and int(load_checkpoint(ckpt, mmap=True).get("global_step", 0)) >= r.max_steps
        resume = ckpt is not None and not done
        if not resume and holds_run(run_dir):  # nothing to resume
            _barrier()  # every rank has read the folder (its metrics, its checkpoint) before rank 0 moves it: rank 1
            # read it as it went (FileNotFoundError: 'runs/NAME/csv/metrics.csv'), and the ladder ended
            if rank_zero():
                _set_aside(run_dir, "ended without a final val/loss in its csv/metrics.csv" if done else
                           "stopped before its first checkpoint")
        _barrier()  # the other ranks start this run after rank 0 moved that folder aside
        values = (r.n_layer, r.n_embd, r.n_head, r.max_steps, r.warmup_steps, "null", r.max_steps * accumulate)
        per_run = [a for flag, value in zip(_SET_PER_RUN, values, strict=True) for a in (flag, str(value))]
        # (each rung's 9-line model summary said again what its "scaling: rung" line says; a config's or a flag's
        # enable_model_summary, given after this, still decides)
        lightning_main(["fit", "--trainer.enable_model_summary", "false", *fit_args, *per_run,
                        "--run.name", run_dir.name, *(["--ckpt_path", "last"] if resume else [])])
        if (signum := late_signal()) is not None:  # it came during the run's final validation: stop here
            raise RunInterrupted(f"interrupted by {signal.Signals(signum).name} as {run_dir} finished; the "
                                 "next runs of the ladder did not start; resume with "
                                 "`tinylm fit --config ... --ckpt_path last`", signum=signum, step=r.max_steps,
                                 ckpt_path="")
        if not rank_zero():  # rank 0 logged the run and reports the ladder
            return math.nan
        loss = final_val_loss(run_dir, r.max_steps)
        if loss is None:
            raise TinyLMError(f"run {run_dir} ended without a final val/loss in its csv/metrics.csv; the "
                              "ladder needs validation at the last step: leave trainer.limit_val_batches and "
                              "logging on")
    if not math.isfinite(loss):
        raise TinyLMError(f"run {run_dir} ended with val/loss {loss}: it diverged, and no law fits it; "
                          "lower --model.lr, move that folder away and run the ladder again")
    return loss


def _set_aside(run_dir: Path, why: str) -> None:
    """Move a rung's folder that cannot be resumed to ``<name>.unfinished-<time>`` (its logs kept), so that the rung
    trains again from scratch."""
    from tinylm.cli.run_lock import lock_run_folder, release_run_folder

    aside = run_dir.with_name(f"{run_dir.name}.unfinished-{time.strftime('%Y%m%d-%H%M%S')}")
    lock_run_folder(run_dir)  # not a run another process is training
    run_dir.rename(aside)
    release_run_folder(run_dir)
    log.info("%s %s; its logs are now in %s, and it starts again", run_dir, why, aside)


def _barrier() -> None:
    """Wait for every rank of the process group the ladder's earlier runs set up (DDP keeps it until exit); none
    before the first run of a ladder on one process, or under ddp_spawn (its ranks are children of this one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _fit_ladder(rungs: list, losses: list[float], budget: float, tokens_per_step: int, out_path: Path) -> dict:
    """Fit the law to the ladder (every rung but the last), find the IsoFLOP optimum, compare the last rung's loss
    with the law's prediction; plot to ``out_path`` and return the numbers."""
    from tinylm.studies.plan import compute_optimal
    from tinylm.studies.scaling import fit_power_law, isoflop_optimum, plot_scaling

    ladder, ladder_losses = rungs[:-1], losses[:-1]
    try:
        law = fit_power_law([r.params for r in ladder], ladder_losses)
    except ValueError as e:  # losses that do not fall with size: the IsoFLOP optimum is the answer, not a law
        law, no_law = None, str(e)
    optimum = isoflop_optimum([r.params for r in ladder], ladder_losses)
    # with no minimum inside, the optimum lies past the end where the loss is lower: above if it still falls at the
    # largest model (by parameters: --sizes may list the ladder in any order)
    by_size = sorted(range(len(ladder)), key=lambda i: ladder[i].params)
    beyond = "below" if ladder_losses[by_size[0]] < ladder_losses[by_size[-1]] else "above"
    big, measured = rungs[-1], losses[-1]
    result = {
        "budget_flops": budget, "tokens_per_step": tokens_per_step,
        "runs": [{"model": r.label, "params": r.params, "steps": r.max_steps, "warmup_steps": r.warmup_steps,
                  "tokens": r.max_steps * tokens_per_step,
                  "val_loss": loss, "fit": law(r.params) if law else None} for r, loss in zip(rungs, losses)],
        "law": {"E": law.E, "A": law.A, "alpha": law.alpha, "rmse": law.rmse} if law else {"none": no_law},
        "isoflop_optimum": {"outside": beyond} if optimum is None else {"params": optimum[0], "val_loss": optimum[1]},
        "chinchilla_optimal_params": compute_optimal(budget)[0],
        "prediction": {"model": big.label, "params": big.params, "predicted": law(big.params) if law else None,
                       "measured": measured, "error": measured - law(big.params) if law else None},
        "plot": str(out_path),
    }
    # the numbers first: a picture without its .json beside it is taken for another file (paths.check_json_beside)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    from tinylm.paths import replace_file

    replace_file(out_path.with_suffix(".json"), lambda tmp: tmp.write_text(jsonlib.dumps(result, indent=2)))
    plot_scaling(ladder, ladder_losses, law, predicted=(big, measured), budget=budget, out=out_path)
    return result


# what a rung learns besides its size and length: every model option, the data (but where it is cached and how
# many workers read it), these Trainer options and the seed. Anything else (paths, logging, samples) may differ.
_PER_RUNG = ("warmup_steps", "decay_steps")  # set per rung, beside the model's "size" fields ("data" from the data)
_DATA_AS_IS = ("cache_dir", "num_workers")
_TRAINER = ("accumulate_grad_batches", "precision", "gradient_clip_val", "gradient_clip_algorithm", "devices",
            "num_nodes")


def _keep_recorded_seed(cli, run_dirs: list[Path], settings: dict) -> None:
    """`--seed_everything true` draws a new seed per command: where the ladder's runs recorded the one an earlier
    run of the command drew, use it (each rung's fit reads it from PL_GLOBAL_SEED), so that rerunning the command
    reuses and resumes them, as it does with a fixed seed, instead of refusing them as another ladder's."""
    import os

    import yaml

    if not getattr(cli, "seed_drawn", False):
        return
    seeds = set()
    for path in (d / "config.yaml" for d in run_dirs):
        if path.is_file():
            seeds.add((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("seed_everything"))
    if len(seeds) == 1 and isinstance(seed := seeds.pop(), int) and not isinstance(seed, bool):
        os.environ["PL_GLOBAL_SEED"] = str(seed)
        settings["seed_everything"] = seed
        log.info("seed_everything true: the ladder's runs drew seed %d; going on with it", seed)


def ladder_settings(config: dict) -> dict[str, object]:
    """The options of a fit config (as a dict, or a run's config.yaml) that must agree for two runs of a ladder's
    rung to be the same run: "section.key" -> value, JSON-normalised."""
    from tinylm.model.config import config_fields

    model, data, trainer = (config.get(k) or {} for k in ("model", "data", "trainer"))
    per_rung = (*config_fields("size", "data"), *_PER_RUNG)
    flat = {f"model.{k}": v for k, v in model.items() if k not in per_rung}
    flat |= {f"data.{k}": v for k, v in data.items() if k not in _DATA_AS_IS}
    flat |= {f"trainer.{k}": trainer[k] for k in _TRAINER if k in trainer}
    flat["seed_everything"] = config.get("seed_everything")
    return jsonlib.loads(jsonlib.dumps(flat, default=str))


def check_ladder_run(run_dir: Path, r, shape: dict, settings: dict | None = None) -> None:
    """Refuse a run folder of this rung's name that holds another model or budget (another --head_size, another
    budget with the same rounded tag, other model options) or was trained otherwise (another lr, warmup,
    optimizer, data seed, batch, ...: `ladder_settings`): its loss would be reported as this rung's, or its
    checkpoint resumed as this rung."""
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    model, trainer = saved.get("model") or {}, saved.get("trainer") or {}
    want = {"model.n_layer": r.n_layer, "model.n_embd": r.n_embd, "model.n_head": r.n_head,
            "model.warmup_steps": r.warmup_steps, "model.decay_steps": None, "trainer.max_steps": r.max_steps}
    want |= {f"model.{k}": v for k, v in shape.items() if k in model}
    have = {k: (model if k.startswith("model.") else trainer).get(k.split(".", 1)[1]) for k in want}
    if settings is not None:  # options in one config only (another tinylm version's) are not compared
        then = ladder_settings(saved)
        common = [k for k in settings if k in then and k not in want]
        want |= {k: settings[k] for k in common}
        have |= {k: then[k] for k in common}
    diff = [f"{k} {have[k]!r} (this ladder: {want[k]!r})" for k in want if have[k] != want[k]]
    if diff:
        # (only the warmup differs: another --model.warmup_steps, or a ladder an earlier tinylm ran; with more, the
        # warmup follows the other settings, e.g. another batch size's steps)
        why = (" (a rung warms up for at most a tenth of its steps: a ladder run by an earlier tinylm kept the "
               "config's warmup)" if len(diff) == 1 and diff[0].startswith("model.warmup_steps") else "")
        raise ValueError(f"{run_dir} holds a run of another ladder: {', '.join(diff[:4])}"
                         f"{f' and {len(diff) - 4} more' if len(diff) > 4 else ''}{why}; pass another --run.name for "
                         "this ladder, or move that folder away")


def final_val_loss(run_dir: Path, max_steps: int) -> float | None:
    """The val/loss a finished run logged at its last step, or None (not run, or not finished: a last row without
    its newline was cut as it was written, "2.0" of "2.0512")."""
    from tinylm.studies.curves import whole_lines

    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(whole_lines(f)) if r.get("val/loss") and r.get("step")]
    done = [r for r in rows if int(float(r["step"])) >= max_steps - 1]
    return float(done[-1]["val/loss"]) if done else None


def format_scaling(r: dict) -> str:
    from tinylm.studies.plan import CHINCHILLA_TOKENS_PER_PARAM

    lines = [(f"compute-matched ladder: {r['budget_flops']:.3g} training FLOPs per model, "
              f"{r['tokens_per_step']:,} tokens per step"),
             f"{'model':<10} {'params':>9} {'steps':>7} {'tokens':>11} {'val/loss':>9} {'fit':>7}"]
    for run in r["runs"]:
        fit = "—" if run["fit"] is None else f"{run['fit']:.4f}"
        lines.append(f"{run['model']:<10} {run['params']:>9,} {run['steps']:>7,} {run['tokens']:>11,} "
                     f"{run['val_loss']:>9.4f} {fit:>7}")
    law = r["law"]
    lines.append(f"no law over the first {len(r['runs']) - 1}: {law['none']}" if "none" in law else
                 f"fit over the first {len(r['runs']) - 1}: L(N) = {law['E']:.4f} + {law['A']:.4g}"
                 f"·N^-{law['alpha']:.4f}"
                 f" (rmse {law['rmse']:.4f} nats{_exact(len(r['runs']) - 1)})")
    opt = r["isoflop_optimum"]
    lines.append("compute-optimal size for this budget: " + (
        f"{opt['params']:,.0f} parameters (IsoFLOP parabola minimum, val/loss {opt['val_loss']:.4f})"
        if "params" in opt else
        "above the ladder's range (the loss still falls at its largest model)" if opt["outside"] == "above" else
        "below the ladder's range (the loss already rises from its smallest model)")
        + f"; Chinchilla's {CHINCHILLA_TOKENS_PER_PARAM:g} tokens/param says {r['chinchilla_optimal_params']:,.0f}")
    p = r["prediction"]
    lines.append(f"prediction for {p['model']} ({p['params']:,} parameters): {p['predicted']:.4f}; measured "
                 f"{p['measured']:.4f}; error {p['error']:+.4f} nats" if p["predicted"] is not None else
                 f"{p['model']} ({p['params']:,} parameters): measured {p['measured']:.4f} (no law to predict it)")
    lines.append(f"wrote {r['plot']} and {Path(r['plot']).with_suffix('.json')}")
    return "\n".join(lines)


def _exact(points: int) -> str:
    """Said of a law fitted to as many points as it has parameters (E, A, alpha): it passes through them."""
    return ("; 3 points for its 3 parameters: it passes through them, so the rmse checks nothing, the prediction "
            "does" if points == 3 else "")
