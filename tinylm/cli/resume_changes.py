"""A resume's checks of the settings it continues with: the trainer options that change what the resumed steps
compute (warned), a changed validation or schedule (warned), and the settings that would not continue the run at all
(refused: a max_time already spent, an accumulation that splits a step). tinylm.cli.resume calls them."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from tinylm.cli.run_folder import kept_settings, read_yaml, run_record
from tinylm.errors import TinyLMError

log = logging.getLogger("tinylm")


_TRAINING_OPTIONS = ("gradient_clip_val", "accumulate_grad_batches", "precision")
"""Trainer options that change what a resumed run computes (a checkpoint does not hold them, so they apply)."""


def _run_config(ckpt_path: str, ckpt: dict | None = None) -> dict:
    """What the checkpoint's run trained with up to it: the settings the checkpoint keeps (those of the command that
    saved it: a step-N.ckpt older than the run's latest resume was trained with the settings before it); else (none
    given, or an older tinylm's) the newest config*.yaml of its run folder (by name: `cp -r` gives a copy's files its
    own times; and config.previous.yaml is another run's; outside its run folder: none); {} if none."""
    if kept := kept_settings(ckpt or {}):
        return kept
    folder = Path(ckpt_path).resolve().parent
    return run_record(folder.parent)[1] if folder.name == "checkpoints" else {}


def _started_config(ckpt_path: str, newest: dict) -> dict:
    """The settings the checkpoint's run started with: its folder's config.yaml; outside its folder (or without
    one), ``newest`` (what the run trained with last)."""
    folder = Path(ckpt_path).resolve().parent.parent
    if folder / "checkpoints" == Path(ckpt_path).resolve().parent and (folder / "config.yaml").is_file():
        return read_yaml(folder / "config.yaml")
    return newest


def keep_run_seed(section, ckpt_path: str | None, drawn: int, *, recorded: bool = True) -> None:
    """``seed_everything true`` (``drawn``: the seed drawn for it): on a resume, the seed the run started with is
    kept instead. The checkpoint restores the run's random state, so a new seed had no effect, yet it was warned about
    ("has no effect") on every resume of a script that passes `--seed_everything true`, and recorded as if it had.
    ``recorded``: whether a config record keeps the seed (validate writes none)."""
    started = None
    if ckpt_path:
        newest = _run_config(ckpt_path)
        if not newest:  # outside its run folder (a branch from a shared checkpoint): the settings it keeps
            from tinylm.checkpoint import CheckpointError, load_checkpoint

            try:
                newest = _run_config(ckpt_path, load_checkpoint(ckpt_path, mmap=True))
            except (OSError, ValueError, CheckpointError):  # (refused later, in its own words)
                newest = {}
        started = _started_config(ckpt_path, newest).get("seed_everything")
    if isinstance(started, int) and not isinstance(started, bool):
        section["seed_everything"] = started
        log.info("seed_everything true on a resume: the run's seed %d is kept (the checkpoint restores its random "
                 "state)", started)
    else:
        log.info("seed_everything true: drew seed %d%s", drawn,
                 " (the run's config.yaml records it)" if recorded else "")


def keep_run_checkpoints(run, ckpt_path: str | None, named: set[str]) -> None:
    """A resume of a run in its own folder (``ckpt_path``; None: no such resume) whose command names no
    run.keep_checkpoints (neither a flag nor its --config: its default, 3) keeps the run's: a run started with
    `--run.keep_checkpoints -1` (or more than 3) and resumed with its config file, which did not name it, had its
    older step-N.ckpt files removed at the resume's start (before a cut save's repair, which trims them too).
    ``run``: the command's run section, set in place; ``named``: the options the command sets."""
    if ckpt_path is None or "run.keep_checkpoints" in named:
        return
    had = (_run_config(ckpt_path).get("run") or {}).get("keep_checkpoints")
    if not isinstance(had, int) or isinstance(had, bool) or had == run.keep_checkpoints:
        return
    log.info("resuming from %s: run.keep_checkpoints %d, the run's (this command leaves it at its default, %d; "
             "--run.keep_checkpoints N sets another)", ckpt_path, had, run.keep_checkpoints)
    run.keep_checkpoints = had


def _windows_a_step(data: dict, trainer: dict) -> int | None:
    """The windows an optimizer step draws (data.batch_size x devices x accumulation) under a config's data and trainer
    sections (dicts, or jsonargparse's Namespaces); None when one of them is not a number."""
    from tinylm.cli.trainer_checks import device_count

    batch, accumulate = data.get("batch_size"), trainer.get("accumulate_grad_batches") or 1
    if not (isinstance(batch, int) and isinstance(accumulate, int)):
        return None
    try:
        return batch * accumulate * device_count(trainer)
    except (TypeError, ValueError):
        return None


def _long_precision(precision: Any) -> Any:
    """A Lightning precision by its full name (16 and "16": "16-mixed", "bf16": "bf16-mixed", 32: "32-true", 64:
    "64-true"), anything else as it is."""
    return {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}.get(str(precision), precision)


def _steps(n: float) -> str:
    return "every optimizer step" if n == 1 else f"every {n:g} optimizer steps"


def warn_training_changes(cfg, ckpt_path: str, *, n_embd: int | None = None, data_state: dict | None = None,
                          ckpt: dict | None = None) -> None:
    """Name the trainer options that change the training and that a resume sets otherwise than the run had (in its
    newest config*.yaml, beside the checkpoint's folder; the accumulation and batch from the checkpoint's own data
    state, `data_state`, where it has them: a branch from an older step-N.ckpt), and a seed_everything that has no
    effect: model options are taken from the checkpoint with a warning; these apply, and the run goes on as another
    run. A checkpoint outside its run folder (``ckpt``) is compared with the settings it keeps."""
    newest = _run_config(ckpt_path, ckpt)
    if not newest:
        return
    trainer, data = dict(newest.get("trainer") or {}), dict(newest.get("data") or {})  # what the run trained with
    _warn_validation_changes(cfg, newest.get("trainer") or {}, dict(data), ckpt_path)  # (its interval and accumulation)
    state = data_state or {}
    if isinstance(state.get("accumulate_grad_batches"), int):  # the checkpoint's own, over its run's newest record
        trainer["accumulate_grad_batches"] = state["accumulate_grad_batches"]
        data["batch_size"], trainer["devices"], trainer["num_nodes"] = state["batch_size"], state["world_size"], 1
    now = {k: cfg.trainer.get(k) for k in _TRAINING_OPTIONS}
    if n_embd and "precision" in trainer:  # an unset precision is resolved by device and width, here as there
        from tinylm.device import resolve_precision

        trainer = {**trainer, "precision": resolve_precision(trainer["precision"], n_embd, trainer.get("accelerator"))}
        now["precision"] = resolve_precision(now["precision"], n_embd, cfg.trainer.get("accelerator"))
    if "precision" in trainer:  # Lightning's short names are the same precisions: 32 is 32-true, bf16 bf16-mixed
        trainer["precision"], now["precision"] = (_long_precision(trainer["precision"]),
                                                  _long_precision(now["precision"]))
    if "accumulate_grad_batches" in trainer:  # unset is 1 (a checkpoint's state says 1)
        trainer["accumulate_grad_batches"], now["accumulate_grad_batches"] = \
            trainer["accumulate_grad_batches"] or 1, now["accumulate_grad_batches"] or 1
    changed = [f"trainer.{k} {now[k]!r} (the run had {trainer.get(k)!r})" for k in _TRAINING_OPTIONS
               if k in trainer and now[k] != trainer.get(k)
               and not (k == "gradient_clip_val" and not now[k] and not trainer[k])  # 0 and unset: no clipping alike
               # accumulation standing in for devices or batch size: the same windows a step (data.datamodule.resplit)
               and not (k == "accumulate_grad_batches"
                        and _windows_a_step(data, trainer) == _windows_a_step(cfg.data, cfg.trainer))]
    if changed:
        log.warning("resuming from %s with %s: the resumed steps train with the new value%s, not as the run did",
                    ckpt_path, ", ".join(changed), "s" if len(changed) > 1 else "")
    started = _started_config(ckpt_path, newest)  # the seed the run started from (a resume's own has no effect)
    seed = cfg.get("seed_everything")
    if "seed_everything" in started and seed not in (None, True) and seed != started["seed_everything"]:
        log.warning("resuming from %s: seed_everything %r has no effect (the run started with %r); the checkpoint "
                    "restores the run's random state, so dropout and data order go on as they were", ckpt_path, seed,
                    started["seed_everything"])


def _warn_validation_changes(cfg, trainer: dict, data: dict, ckpt_path: str) -> None:
    """Name a resume that validates at other steps, or on other windows, than the run did (`trainer` and `data`: the
    run's sections)."""
    every, had_every = cfg.trainer.get("val_check_interval"), trainer.get("val_check_interval")
    accumulate, had = cfg.trainer.get("accumulate_grad_batches") or 1, trainer.get("accumulate_grad_batches") or 1
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (every, had_every, accumulate, had)) \
            and every * had != had_every * accumulate:  # Lightning counts the interval in micro-batches
        log.warning("resuming from %s with trainer.val_check_interval %d and accumulate_grad_batches %d: it validates "
                    "%s, the run %s; pass --trainer.val_check_interval %s to keep the run's (the interval counts "
                    "micro-batches)", ckpt_path, every, accumulate, _steps(every / accumulate),
                    _steps(had_every / had), f"{had_every * accumulate / had:g}")
    cut, had_cut = cfg.trainer.get("limit_val_batches"), trainer.get("limit_val_batches")
    def whole(v: Any) -> bool:  # null and the float 1.0 validate every batch; the int 1, one batch
        return v is None or isinstance(v, float) and v == 1.0

    if (type(cut), cut) != (type(had_cut), had_cut) and not (whole(cut) and whole(had_cut)):
        log.warning("resuming from %s with trainer.limit_val_batches %r (the run had %r): val/loss is measured on "
                    "other windows from here on, so its curve jumps and best.ckpt is picked across the two; pass "
                    "--trainer.limit_val_batches %r to keep the run's", ckpt_path, cut, had_cut, had_cut)
    limit, batch, had_batch = cfg.data.get("val_batches"), cfg.data.get("batch_size"), data.get("batch_size")
    had_limit = data.get("val_batches", limit)

    def windows(batches: Any, size: Any) -> Any:  # what validation reads: val_batches x batch_size windows
        return batches * size if all(isinstance(v, int) and not isinstance(v, bool) for v in (batches, size)) \
            else batches

    if windows(limit, batch) == windows(had_limit, had_batch):  # (the run's, as its advice below gives them)
        return
    if limit != had_limit:
        log.warning("resuming from %s with data.val_batches %r (the run had %r): val/loss is measured on other "
                    "windows from here on, so its curve jumps and best.ckpt is picked across the two",
                    ckpt_path, limit, data["val_batches"])
    elif isinstance(limit, int) and isinstance(batch, int) and isinstance(had_batch, int) and batch != had_batch:
        keep = f"--data.val_batches {limit * had_batch // batch}" if limit * had_batch % batch == 0 else \
            "data.val_batches null (the whole split)"
        log.warning("resuming from %s with data.batch_size %d (the run had %d) and data.val_batches %d: it counts "
                    "batches of data.batch_size windows, so val/loss is measured on other windows from here on; "
                    "pass %s to keep the run's", ckpt_path, batch, had_batch, limit, keep)


def warn_schedule_change(ckpt: dict, hparams: dict, max_steps: int | None, ckpt_path: str) -> None:
    """Name the learning-rate jump of a resume whose schedule length changed (its length is trainer.max_steps
    unless model.decay_steps was set): the cosine is stretched from here on, not continued."""
    from tinylm.train.schedules import lr_at

    try:
        scheduler = ckpt["lr_schedulers"][0]
        was = float(scheduler["_last_lr"][0])  # the LR the next step would have used (AdamW's first group)
        step = int(ckpt["global_step"])
        # the stability guard's rollbacks multiplied the schedule's peak (the scheduler's base LRs) by lr_factor
        peak = float(scheduler.get("base_lrs", [hparams["lr"]])[0])
        now = lr_at(step, schedule=hparams["lr_schedule"], lr=hparams["lr"], min_lr=hparams["min_lr"],
                    warmup_steps=hparams["warmup_steps"], decay_steps=hparams.get("decay_steps") or max_steps,
                    decay_fraction=hparams.get("decay_fraction", 0.2)) * peak / float(hparams["lr"])
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):  # an older checkpoint, another scheduler
        return
    if max_steps and not math.isclose(was, now, rel_tol=1e-6, abs_tol=1e-12):
        # as many digits as tell the two apart (a run extended by 10 steps at its end: "from 0.0001 to 0.0001")
        digits = next((d for d in (3, 6, 9) if f"{was:.{d}g}" != f"{now:.{d}g}"), 12)
        log.warning("resuming from %s at step %d with trainer.max_steps %d: the LR schedule's length is max_steps "
                    "(model.decay_steps is unset), so the LR jumps from %s to %s and the decay is stretched over "
                    "the new length; pin model.decay_steps when you start a run you may extend", ckpt_path, step,
                    max_steps, f"{was:.{digits}g}", f"{now:.{digits}g}")


def check_time_left(ckpt: dict, max_time: Any, ckpt_path: str) -> None:
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


def check_accumulation(ckpt: dict, accumulate: Any, ckpt_path: str, val_check_interval: Any = None,
                       had: Any = None) -> None:
    """Refuse a resume whose --trainer.accumulate_grad_batches does not divide the micro-batches the checkpoint's
    epoch has done: Lightning steps when that count reaches a multiple of it, so the first step would sum fewer
    micro-batches than it divides by (a gradient too small by that ratio, and clipped as such). A checkpoint that
    says its run's accumulation (`had`, from its data module's state) has its count taken again in this run's
    (TinyLMDataModule.resume_split), which leaves only an edited one to refuse here."""
    try:
        progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]
        done, epoch_ended = int(progress["current"]["ready"]), bool(progress["is_last_batch"])
        trained = int(progress["current"].get("processed", done))  # fewer: a batch drawn, not trained
    except (KeyError, TypeError, ValueError, AttributeError):  # not a Lightning training checkpoint: restoring it
        return  # will say so
    if trained < done:  # (the resume trains that batch: TinyLMDataModule._drop_unrun_batch)
        done, epoch_ended = trained, False
        step = had if isinstance(had, int) and had > 0 else accumulate if isinstance(accumulate, int) else 1
        if step > 1 and done % step:
            raise TinyLMError(f"{ckpt_path} was saved inside an optimizer step, after {done % step} of its {step} "
                              "micro-batches (Lightning's OnExceptionCheckpoint, at a failure mid-accumulation): "
                              "the gradients accumulated so far are not in it, so no resume goes on exactly from it; "
                              "move it away and resume from the run's last.ckpt or a step-N.ckpt")
    if isinstance(had, int) and had > 0 and isinstance(accumulate, int) and done * accumulate % had == 0:
        done = done * accumulate // had  # as resume_split counts it
    if not isinstance(accumulate, int) or accumulate <= 1 or epoch_ended or done % accumulate == 0:
        return
    short = accumulate - done % accumulate
    every = val_check_interval if isinstance(val_check_interval, int) else None
    # the values that divide both the micro-batches done and the validation interval (fit's own check)
    usable = [a for a in range(2, min(done, 4 * accumulate) + 1) if done % a == 0 and (every is None or every % a == 0)]
    near = sorted(sorted(usable, key=lambda a: abs(a - accumulate))[:3])
    had = (_run_config(ckpt_path, ckpt).get("trainer") or {}).get("accumulate_grad_batches")
    own = f"the run's own {had}" if isinstance(had, int) else "the run's own value"
    fits = f" or one that divides {done}" + (f" and trainer.val_check_interval {every}" if every else "") + \
           f" ({', '.join(map(str, near))})" if near else ""
    raise TinyLMError(f"--trainer.accumulate_grad_batches {accumulate} does not divide the {done} micro-batches "
                      f"{ckpt_path} has done in its epoch: the first step would sum {short} micro-batch"
                      f"{'es' if short > 1 else ''}, each "
                      f"divided by {accumulate}; resume with {own}{fits}")
