"""The RunConfig callback: a run's config.yaml (and the resume records beside it), and its start line."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import SaveConfigCallback

from tinylm.cli.callback_checks import dumped, keep_none, keep_own_patience
from tinylm.cli.run_folder import run_config_file
from tinylm.paths import replace_file
from tinylm.train.loggers import finish_forked_wandb, wandb_loggers

log = logging.getLogger("tinylm")


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
        self._record: str | None = None  # the config's text that each checkpoint keeps

    def setup(self, trainer, pl_module, stage: str) -> None:
        # a run from a checkpoint (a resume, or a branch into a new folder) writes at on_train_start: every rank
        # decides alike from the command line (a decision by what is on disk once hung DDP: a rank that looked after
        # rank zero wrote config.yaml skipped a broadcast), and a branch refused on restoring leaves no config.yaml
        if self.resume_step is None:
            super().setup(trainer, pl_module, stage)
        else:  # (before Lightning restores the callbacks: what the resume's record says is what runs)
            keep_own_patience(trainer.callbacks)
        if multiprocessing.parent_process() is not None and "wandb" in sys.modules:  # a rank that ddp_fork started
            # it leaves by os._exit, past the atexit hook with which wandb ends its run: the run's file kept no
            # metric. Multiprocessing's own exit hooks do run (also after an error), and end it here.
            import atexit
            from multiprocessing.util import Finalize

            Finalize(None, finish_forked_wandb, args=(trainer,), exitpriority=100)
            # Python 3.13+ runs a forked child's atexit hooks too, before multiprocessing's: wandb's own (registered
            # at wandb.init, before this) closed its service first, and the run never ended ("MailboxClosedError").
            # The hook registered last runs first; the Finalize above then finds no run.
            atexit.register(finish_forked_wandb, trainer)

    def on_train_start(self, trainer, pl_module) -> None:
        super().setup(trainer, pl_module, "fit")  # once: Lightning's setup returns if already saved
        # the reasons EarlyStopping restored from the checkpoint: a stop of the run before this command
        self._reasons = {id(cb): getattr(cb, "stopping_reason_message", None) for cb in trainer.callbacks}
        data = trainer.datamodule
        if trainer.is_global_zero and data is not None:  # what an optimizer step is made of, devices included
            B, A, W, T = data.batch_size, trainer.accumulate_grad_batches, trainer.world_size, data.block_size
            step, max_steps, done = B * A * W * T, trainer.max_steps, trainer.global_step
            splits = [meta["splits"]["train"]["tokens"] for meta in data.metas]
            split = sum(splits)
            # a resume: what its steps read (at another accumulation, another batch), then the steps left at this one
            before = data.resumed_batches * B * W * T if 0 < done < max_steps and data.resumed_batches else None
            total = step * max_steps if before is None else before + step * (max_steps - done)
            which = "trainer.fast_dev_run" if trainer.fast_dev_run else "trainer.max_steps"
            run = (f"; {max_steps:,} steps ({which}) read {total:,} tokens: "
                   f"{total / split:.3g} passes over the training split ({split:,} tokens)"
                   if max_steps > 0 else "")
            # data.weights draw each corpus at its own pace (unset: in proportion to its tokens, all at one pace):
            # [0.1, 0.9] over 18,000 and 2,700 tokens read the small one 30 times as often as the 0.297 passes say
            weighted = len(splits) > 1 and data.weights is not None
            shares = [w / sum(data.weights) for w in data.weights] if weighted else [1.0]
            if weighted and max_steps > 0:
                run += " (by data.weights: " + ", ".join(
                    f"{name} {total * share / n:.3g} passes of {n:,}"
                    for name, share, n in zip(data.val_names, shares, splits)) + ")"
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

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # the run's settings in each of its checkpoints: one outside its run folder (copied, downloaded) resumes as
        # the run trained (run_folder.with_run_config)
        if self._record is None:
            config = self.config.clone()
            config.ckpt_path = None
            self._record = dumped(self.parser, config)
        checkpoint.setdefault("tinylm", {})["config"] = self._record

    def on_fit_end(self, trainer, pl_module) -> None:
        # said here, in the process that trained: under ddp_fork the command's own trainer stays at step 0
        t = trainer
        if t.is_global_zero and 0 < t.max_steps and t.global_step < t.max_steps:  # EarlyStopping is silent
            saved = "; last.ckpt is saved there: --ckpt_path last goes on" if t.checkpoint_callbacks else ""
            log.info("the run stopped at step %d of trainer.max_steps %d (%s)%s", t.global_step, t.max_steps,
                     _stopped_by(t, getattr(self, "_reasons", {})), saved)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        path = self.run_dir / "config.yaml"
        if self.continues and (path.exists() or run_config_file(self.run_dir)):  # (config.yaml gone, records kept)
            path = _unused(self.run_dir / f"config.resume-step{self.resume_step}.yaml")  # resumed from this step
            # before (killed in between): that record is kept too
            self.run_dir.mkdir(parents=True, exist_ok=True)
            replace_file(path, lambda tmp: tmp.write_text(self._resume_record(), encoding="utf-8"))
            return self._log_to_wandb(trainer)
        record = self._fresh_record(pl_module)
        if os.path.lexists(path) and (path.is_symlink() or not path.is_file() or path.read_text(errors="replace")
                                        != (record or dumped(self.parser, self.config))):
            # a link (dangling too) or a folder is moved aside like a file: written through, a link put the config
            # outside the run folder; read, a folder crashed the run
            kept = _unused(self.run_dir / "config.previous.yaml")
            path.rename(kept)
            log.warning("%s was not this run's config: kept as %s", path, kept.name)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # (a file renamed into place: a kill or a full disk mid-write leaves no half-written record)
        if record is not None:
            replace_file(path, lambda tmp: tmp.write_text(record, encoding="utf-8"))
        elif not self.multifile:  # (what parser.save writes then: the dump, in the locale's encoding as open() does)
            replace_file(path, lambda tmp: tmp.write_text(dumped(self.parser, self.config)))
        else:
            replace_file(path, lambda tmp: self.parser.save(self.config, tmp, **keep_none(), overwrite=True,
                                                            multifile=self.multifile))
        self._log_to_wandb(trainer)

    def _fresh_record(self, pl_module) -> str | None:
        """A new run's config.yaml, with a comment naming what it started from as it was then (the absolute path, and
        the step), since a source run saves over its last.ckpt and best.ckpt and drops old step-N.ckpt files: above
        ``init_from:`` for a run from model.init_from's weights (the record said only ``init_from:
        runs/src/checkpoints/last.ckpt``: from which step, and relative to which folder, nobody could tell later),
        and above ``ckpt_path: null`` for a branch from another run's checkpoint, as a resume's record (given later
        as --config, a record that named it branched from whatever that file was by then, or from the folder the
        command ran in). None: the config as the parser saves it."""
        source = getattr(pl_module, "init_source", None)
        branch = self.config.ckpt_path
        if (source is None and not branch) or self.multifile:
            return None
        config = self.config.clone()
        config.ckpt_path = None
        lines = dumped(self.parser, config).splitlines(keepends=True)
        if branch:
            at = next((i for i, line in enumerate(lines) if line.startswith("ckpt_path:")), 0)
            lines[at:at] = [f"# branched at step {self.resume_step} from {os.path.abspath(branch)} as it was then "
                            "(a run\n# saves over or deletes its checkpoints as it goes on, so ckpt_path names none): "
                            "with --config THIS_FILE, --ckpt_path last continues this run\n"]
        at = next((i for i, line in enumerate(lines) if line.lstrip().startswith("init_from:")), None)
        if at is not None and source is not None:
            step = getattr(pl_module, "init_step", None)
            indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
            lines[at:at] = [f"{indent}# first weights (model.init_from): {source}"
                            f"{'' if step is None else f' at step {step}'}, as they were then\n",
                            f"{indent}# (a run saves over its last.ckpt and best.ckpt as it goes on)\n"]
        return "".join(lines)

    def _resume_record(self) -> str:
        """The resume's config as config.resume-step<N>.yaml holds it: with ``ckpt_path: null`` and a comment above
        it naming the step and the file the resume started from. The file itself changes as the run goes on
        (last.ckpt at every save; step-N.ckpt goes when run.keep_checkpoints drops it): named as ckpt_path, the
        record given later as --config resumed from whatever last.ckpt was by then, not from step N."""
        config = self.config.clone()
        config.ckpt_path = None
        lines = dumped(self.parser, config).splitlines(keepends=True)
        at = next((i for i, line in enumerate(lines) if line.startswith("ckpt_path:")), 0)
        started = os.path.abspath(self.config.ckpt_path)
        note = (f"# resumed at step {self.resume_step} from {started} as it was then (a run saves over or deletes\n"
                "# its checkpoints as it goes on, so ckpt_path names none): with --config THIS_FILE, --ckpt_path last "
                "continues the run\n")
        return "".join([*lines[:at], note, *lines[at:]])

    def _log_to_wandb(self, trainer) -> None:
        # W&B has the model's and the data's hyperparameters (Lightning logs those); the rest of the run's settings
        # (max_steps, accumulate_grad_batches, precision, seed, ...) only the config holds
        wandb = wandb_loggers(trainer.loggers)
        if wandb:
            config = json.loads(self.parser.dump(self.config, **keep_none(), format="json"))
            for logger in wandb:
                logger.log_hyperparams({k: v for k, v in config.items() if k not in ("model", "data")})


def _unused(path: Path) -> Path:
    """``path``, or the first of ``<stem>-2<suffix>``, ``-3``... that does not exist."""
    n, free = 1, path
    while os.path.lexists(free):  # a dangling link is taken too
        n += 1
        free = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return free


def _stopped_by(trainer, before: dict[int, str | None]) -> str:
    """What stopped a run before max_steps: an EarlyStopping callback (with its reason, one it gave in this command:
    not one of ``before``, restored from the checkpoint), --trainer.max_time (the Timer's time is up), or, when
    neither says so, one of them or another callback."""
    from lightning.pytorch.callbacks import EarlyStopping, Timer

    for cb in trainer.callbacks:
        reason = getattr(cb, "stopping_reason_message", None)  # (Lightning 2.6)
        if isinstance(cb, EarlyStopping) and reason and reason is not before.get(id(cb)):
            return f"{type(cb).__name__}: {reason.removesuffix(' Signaling Trainer to stop.').rstrip('.')}"
        if isinstance(cb, Timer) and (left := cb.time_remaining()) is not None and left <= 0:
            return f"--trainer.max_time: {cb._duration:g} s"
    return "--trainer.max_time, or a callback such as EarlyStopping"
