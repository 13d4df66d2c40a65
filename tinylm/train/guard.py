"""The stability guard: steps that would break a run are not applied, and a run that diverges anyway goes back to
its last good checkpoint with a lower learning rate (``--guard.*``).

Each optimizer step is judged on the device, after its gradients are known and before the optimizer uses them
(`TinyLM.configure_gradient_clipping` calls `StabilityGuard.judge`): the step is *skipped* when its loss or
gradient norm is NaN/Inf, or when its loss (optionally its gradient norm) is an outlier against the accepted steps
of the recent window, by a robust z-score, (x - median) / (1.4826 * MAD) (llm.c skips updates too, judged by a
mean/std z-score; the limit, median + z x 1.4826 x MAD, is refreshed on the device every
``trainer.log_every_n_steps`` steps; per step the judgement is a dozen tiny tensor operations). A skipped step
is not applied: AdamW's fused kernel is handed the decision as its ``found_inf`` (the flag GradScaler uses), so
parameters, moments and AdamW's step count stay as they were without the host reading the flag; other optimizers
(Muon) have their gradients dropped, which needs the flag on the host (free on a CPU, one sync per step on a GPU).
The step still counts: global_step, the LR schedule and the data move on, so the skipped batch is left out.
Under ``16-mixed`` a finite loss with non-finite gradients is GradScaler's overflow, which it skips itself (lowering
its scale): not counted as a skip nor judged (its calibration overflows the first steps of a run in a row).

Every ``trainer.log_every_n_steps`` steps the guard reads its state from the device (one sync, on a step that logs
anyway), logs ``train/skipped_steps`` (skipped so far) and *rolls back* when ``rollback_skips`` of the window's
steps were skipped or the recent loss stays ``rollback_loss_rise`` above its level: the weights and optimizer state
of the newest checkpoint saved before the trouble are loaded in place, the LR (every group's peak, so the whole
schedule) is multiplied by ``lr_factor``, and the run goes on from its current step and data position. After
``max_rollbacks`` rollbacks, or with no checkpoint to go back to, the run stops with one line naming the checkpoint
to start again from (`GuardStop`, exit 1).

Under DDP the decision is the same on every rank: the gradient norm is already the ranks' (gradients are
all-reduced in the backward pass) and the loss judged is the ranks' mean. Its state (the window, the counts, the
level) is saved in checkpoints, and the lowered LR with the scheduler's base LRs, so exact resume still holds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from tinylm.errors import TinyLMError
from tinylm.ranges import check_ranges
from tinylm.train.module import host_scalar, logging_step
from tinylm.train.parallel import shards_weights

log = logging.getLogger("tinylm")

MAD_TO_STD = 1.4826  # the MAD of a normal distribution times this is its standard deviation
DIVERGED_FACTOR = 1.5  # a loss above this multiple of ln(vocab) is worse than guessing (health's `diverged` default)


class GuardStop(TinyLMError, RuntimeError):
    """The run diverged again after the guard's last allowed rollback, or had no checkpoint to go back to (raised by
    every rank together: their decisions are the same)."""

    every_rank = True


class StabilityGuard(L.Callback):
    """Skips the optimizer steps that would break the run and rolls a diverging run back to its last good
    checkpoint at a lower LR. ``--guard.enabled false`` turns it off (the health monitor then only reports).

    Args:
        enabled: Judge every optimizer step (skip, roll back); false turns the guard off.
        loss_z: Skip a step whose loss is more than this many robust standard deviations (1.4826 x the median
            absolute deviation) above the median of the window's accepted losses; null skips only NaN/Inf steps.
        grad_norm_z: The same for the gradient norm (before clipping); null (the default): only a NaN/Inf norm.
            Clipping already bounds a large norm's update; a loss outlier is the surer sign of a bad batch.
        window: Optimizer steps in the reference window (skipped steps leave a hole in it).
        min_history: Accepted steps the window must hold before outliers are judged (NaN/Inf always are); the
            outlier limits are taken from the window every ``trainer.log_every_n_steps`` steps.
        rollback_skips: Roll back when this many of the window's steps were skipped; 0: never for skips.
        rollback_loss_rise: Roll back when the median loss of the last ``window // 5`` accepted steps is more than
            this fraction above the loss's level (the lowest median of a full window in the run, kept across
            rollbacks: they take the weights back to before the trouble); null: never for a high loss.
        lr_factor: Each rollback multiplies the learning rate (the schedule's peak, so every later step's) by this.
        max_rollbacks: Rollbacks allowed in the run; one more divergence stops it with the checkpoint to go back to.
    """

    def __init__(self, *, enabled: bool = True, loss_z: float | None = 6.0, grad_norm_z: float | None = None,
                 window: int = 100, min_history: int = 20, rollback_skips: int = 5,
                 rollback_loss_rise: float | None = 0.5, lr_factor: float = 0.5, max_rollbacks: int = 3) -> None:
        check_ranges("guard", {"loss_z": loss_z, "grad_norm_z": grad_norm_z, "window": window,
                               "min_history": min_history, "rollback_skips": rollback_skips,
                               "rollback_loss_rise": rollback_loss_rise, "lr_factor": lr_factor,
                               "max_rollbacks": max_rollbacks},
                     {"loss_z": "(0, inf)", "grad_norm_z": "(0, inf)", "window": "[5, inf)",
                      "min_history": "[3, window]", "rollback_skips": "[0, window]", "rollback_loss_rise": "(0, inf)",
                      "lr_factor": "(0, 1]", "max_rollbacks": "[0, inf)"},
                     whole=("window", "min_history", "rollback_skips", "max_rollbacks"))
        self.enabled, self.window, self.min_history = enabled, window, min_history
        self.loss_z, self.grad_norm_z = loss_z, grad_norm_z
        self.rollback_skips, self.rollback_loss_rise = rollback_skips, rollback_loss_rise
        self.lr_factor, self.max_rollbacks = lr_factor, max_rollbacks
        self.rollbacks = 0
        # the steps each rollback threw away, (the checkpoint's step, the step it rolled back at): a checkpoint saved
        # at one of them holds weights the run abandoned (a later rollback took one, undoing the earlier); one saved
        # at the rollback's own step holds the rolled-back weights (Lightning runs checkpoint callbacks last)
        self.abandoned: list[tuple[int, int]] = []
        self.level: float | None = None  # the lowest median loss of a full window in the run (rollbacks keep it)
        # the last `window` steps by slot step % window: loss, grad norm (NaN where skipped or not yet taken), and
        # 1.0 where the step was skipped
        self._history: torch.Tensor | None = None
        self._limit: torch.Tensor | None = None  # (2,) loss, grad norm above which a step is an outlier
        self._limit_before: torch.Tensor | None = None  # the limit before this logging step's refresh (_rollback)
        self._skipped = torch.zeros((), dtype=torch.int64)  # skipped steps so far
        self._told = (0, 0)  # the skipped steps said so far, and the step they were said at
        self._saved: dict | None = None  # a checkpoint's state, put on the device at train start
        self._step_seen = -1

    # ---- the step: on the device ---------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        device = pl_module.device
        self._history = torch.full((self.window, 3), float("nan"), device=device)
        self._history[:, 2] = 0.0
        self._limit = torch.full((2,), math.inf, device=device)
        self._skipped = self._skipped.to(device)
        if self._saved is not None:
            state, self._saved = self._saved, None
            self._history.copy_(state["history"])
            self._limit.copy_(state["limit"])
            self._skipped = state["skipped"].to(device)
        self._z = torch.tensor([self.loss_z or math.inf, self.grad_norm_z or math.inf], device=device)
        self._step_seen = trainer.global_step
        self._told = (self._told[0], trainer.global_step)  # (a resume's skips are said from its first step)
        # a loss above this is a model worse than guessing uniformly (the health monitor's `diverged`): weights past
        # it are no state to roll back to, though their loss was finite
        self._ceiling = DIVERGED_FACTOR * math.log(pl_module.hparams.vocab_size)
        pl_module.step_guard = self.judge

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.step_guard = None

    @property
    def skipped(self) -> int:
        """Steps skipped so far (a host sync: for a line at a validation, not for every step)."""
        return int(self._skipped)

    def judge(self, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer, norm: torch.Tensor) -> None:
        """Decide whether this optimizer step is applied (called between the gradient norm and the optimizer's
        update) and make the optimizer skip it if not: a dozen tiny tensor operations on the device, no sync (but
        for optimizers that cannot take the decision as a tensor)."""
        trainer = pl_module.trainer
        loss = pl_module.step_loss
        x = torch.stack([loss.detach().float().reshape(()), norm.detach().float().reshape(())])  # (2,)
        if trainer.world_size > 1:  # every rank judges the same numbers: the ranks' mean loss (the norm is the same)
            # (not strategy.reduce: Lightning's reduce waits at a barrier first, a host sync on NCCL)
            torch.distributed.all_reduce(x, op=torch.distributed.ReduceOp.SUM)
            x = x / trainer.world_size
        skip = ~x.isfinite().all() | (x > self._limit).any()
        if grad_scaler(trainer) is not None:  # 16-mixed: GradScaler skips an fp16 overflow itself, lowering its
            scaled = x[0].isfinite() & ~x[1].isfinite()  # scale (its calibration overflows a run's first steps)
            skip, x = skip & ~scaled, torch.where(scaled, math.nan, x)
        self._history[trainer.global_step % self.window] = torch.cat([torch.where(skip, math.nan, x),
                                                                      skip.float()[None]])
        self._skipped += skip
        pl_module.step_skipped = skip
        _skip_update(optimizer, skip)
        self._limit_before = self._limit  # what stays if a rollback at this step's end leaves too few steps
        if scheduled_logging_step(trainer):  # queued here, while the GPU is busy, not after the host's read
            self._refresh_limit()

    def _refresh_limit(self, kept: torch.Tensor | None = None) -> None:
        """The outlier limits from the window's accepted steps: median + z x 1.4826 x MAD, once it holds
        min_history of them (else the limits stay, or become ``kept``: a run of skips is judged against the steps
        before it)."""
        history = self._history[:, :2]  # (window, 2)
        median = nanmedian_columns(history)  # (2,)
        scale = MAD_TO_STD * nanmedian_columns((history - median).abs())  # (2,)
        enough = (~history[:, 0].isnan()).sum() >= self.min_history
        self._limit = torch.where(enough, median + self._z * scale.clamp(min=1e-6 * median.abs()),
                                  self._limit if kept is None else kept)

    # ---- every log_every_n_steps: on the host --------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if not self.enabled or trainer.global_step == self._step_seen:
            return  # mid-accumulation: the step is judged once it is taken
        self._step_seen = step = trainer.global_step
        if not logging_step(trainer):
            return
        # the one sync, on a step that logs anyway: the window's losses and skip flags, and the count
        values = torch.cat([self._history[:, [0, 2]].T.flatten(), self._skipped.reshape(1).float()]).tolist()
        losses, skips, skipped = values[: self.window], values[self.window : 2 * self.window], int(values[-1])
        pl_module.log("train/skipped_steps", host_scalar(float(skipped)), rank_zero_only=True)
        self._tell_skips(trainer, step, skipped, skips)
        # (at the step a run stops at between two scheduled ones the level stays the uninterrupted run's)
        trouble = self._trouble(step, losses, skips, update_level=scheduled_logging_step(trainer))
        if trouble is not None:
            what, first = trouble
            order = range(step - self.window, step)  # the window's steps, by slot: the first worse than guessing
            worse = [s for s in order if s >= 0 and losses[s % self.window] > self._ceiling]
            self._rollback(trainer, pl_module, what, min([first, *worse]), worse=bool(worse) and worse[0] < first)

    def _tell_skips(self, trainer: L.Trainer, step: int, skipped: int, skips: list[float]) -> None:
        """A line for the steps skipped since the last logging step (train/skipped_steps alone told them: a rare
        batch dropped as an outlier went by unseen), naming those still in the window (by slot: step % window)."""
        told, since = self._told
        self._told = (skipped, step)
        if skipped <= told or not trainer.is_global_zero:
            return
        steps = [s + 1 for s in range(max(since, step - self.window), step) if skips[s % self.window]]
        named = f": step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))}" if len(steps) == skipped - told else ""
        log.info("tinylm guard: %d step(s) skipped since step %d%s (loss or gradient norm an outlier against the "
                 "last %d steps, or not finite; train/skipped_steps counts them, --guard.enabled false keeps them)",
                 skipped - told, since, named, self.window)

    def _trouble(self, step: int, losses: list[float], skips: list[float],
                 update_level: bool = True) -> tuple[str, int] | None:
        """What calls for a rollback, if anything: (what happened, the first step it concerns), from the window's
        losses and skip flags (by slot: step % window)."""
        order = [(step - self.window + i) for i in range(self.window)]  # the last `window` steps, oldest first
        flags = [skips[s % self.window] for s in order]
        if self.rollback_skips and sum(flags) >= self.rollback_skips:
            first = next(s for s, f in zip(order, flags) if f)  # a step index: step-N names it N = first + 1
            return f"{int(sum(flags))} of the last {self.window} steps skipped (first at step {first + 1})", first
        by_step = [(s, losses[s % self.window]) for s in order if not math.isnan(losses[s % self.window])]
        accepted = [v for _, v in by_step]
        if len(accepted) < self.window // 2 or self.rollback_loss_rise is None:
            return None
        median = sorted(accepted)[len(accepted) // 2]
        recent = accepted[-max(self.window // 5, 1):]
        recent_median = sorted(recent)[len(recent) // 2]
        if self.level is not None and recent_median > (1 + self.rollback_loss_rise) * self.level:
            first = next(int(s) for s, v in by_step if v > (1 + self.rollback_loss_rise) * self.level)
            return (f"loss {recent_median:.3f} over the last {len(recent)} steps, "
                    f"{recent_median / self.level - 1:.0%} above its level {self.level:.3f}"), first
        if update_level and len(accepted) == self.window and (self.level is None or median < self.level):
            self.level = median
        return None

    def _rollback(self, trainer: L.Trainer, pl_module: L.LightningModule, what: str, first_bad: int, *,
                  worse: bool = False) -> None:
        """Load the newest checkpoint whose weights have not seen step index ``first_bad`` (nor steps an earlier
        rollback abandoned), lower the LR, go on; or stop the run (`GuardStop`). ``worse``: ``first_bad`` is the
        first step whose loss was worse than guessing, before the trouble seen."""
        ckpt = last_good_checkpoint(trainer, first_bad, self.abandoned)
        step = trainer.global_step
        if ckpt is None or self.rollbacks >= self.max_rollbacks or shards_weights(trainer):
            why = (f"no checkpoint from before step {first_bad + 1} is on disk (its loss was already above "
                   f"{DIVERGED_FACTOR} x ln(vocab), worse than guessing)" if ckpt is None and worse else
                   "no checkpoint from before it is on disk (only the newest run.keep_checkpoints step-N.ckpt are "
                   "kept, and none a rollback abandoned)" if ckpt is None else
                   f"after {self.rollbacks} rollback(s) (guard.max_rollbacks)" if self.rollbacks >= self.max_rollbacks
                   else f"the {type(trainer.strategy).__name__} strategy's checkpoints are not rolled back in place")
            fix = (f"start a new run from {ckpt} with a lower LR (--model.init_from {ckpt} --model.lr ... --run.name "
                   "NEW_NAME)" if ckpt is not None else "start again with a lower --model.lr or a longer warmup")
            from tinylm.train.callbacks import log_step_row_now

            log_step_row_now(trainer)  # the row of the step it stops at (its skips decided it): Lightning's is lost
            raise GuardStop(f"tinylm guard: training diverged at step {step} ({what}) and {why}; {fix}")
        self.rollbacks += 1
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        self.abandoned.append((int(state.get("global_step", 0)), step))
        pl_module.load_state_dict(state["state_dict"])
        optimizer = trainer.optimizers[0]
        optimizer.load_state_dict(state["optimizer_states"][0])
        for config in trainer.lr_scheduler_configs:  # the peak of every group, so the whole schedule from here
            sched = config.scheduler
            sched.base_lrs = [base * self.lr_factor for base in sched.base_lrs]
            for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas, strict=True):
                group["lr"] = base * fn(sched.last_epoch)
            # as its step() leaves it: a checkpoint of this step kept the LR before the rollback there, and a resume
            # of it said the LR "jumps" to the one the run had (tinylm.cli.resume_changes.warn_schedule_change)
            sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]
        # the window keeps the steps before the trouble, which the weights are back to: the steps after the rollback
        # are judged against them at once (an empty window let the next explosion through)
        for bad in range(max(first_bad, step - self.window), step):
            self._history[bad % self.window, :2] = math.nan
        self._history[:, 2] = 0.0
        # from the window without the steps rolled back; too few left: the limit from before this step's refresh
        # (which counted the steps rolled back)
        self._refresh_limit(kept=self._limit_before)
        log.warning("tinylm guard: step %d: %s; rolled back to %s (step %s) with the LR x%g (rollback %d of %d)",
                    step, what, ckpt, state.get("global_step"), self.lr_factor, self.rollbacks, self.max_rollbacks)

    # ---- state survives resume -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state: dict[str, Any] = {"rollbacks": self.rollbacks, "level": self.level, "skipped": self._skipped.cpu(),
                                 "abandoned": [list(span) for span in self.abandoned]}
        if self._history is not None:
            state |= {"history": self._history.cpu(), "limit": self._limit.cpu()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self.rollbacks, self.level = int(state_dict.get("rollbacks", 0)), state_dict.get("level")
        self.abandoned = [(int(lo), int(hi)) for lo, hi in state_dict.get("abandoned", [])]
        self._skipped = state_dict.get("skipped", torch.zeros((), dtype=torch.int64)).clone()
        self._told = (int(self._skipped), 0)  # (said by the run before the resume; the step: at train start)
        history = state_dict.get("history")
        if history is not None and history.shape == (self.window, 3):  # (a changed guard.window starts afresh)
            self._saved = {"history": history, "limit": state_dict["limit"], "skipped": self._skipped}


def scheduled_logging_step(trainer: L.Trainer) -> bool:
    """`logging_step`, leaving out the one Lightning adds where a run stops between two scheduled ones (max_steps,
    a callback's stop): the guard's limit and level follow the schedule, so that a run stopped there and resumed
    (extended) judges its steps as the uninterrupted run does (a rollback there still happens)."""
    if not logging_step(trainer):
        return False
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if not getattr(trainer, "should_stop", False) or loop is None:
        return True
    every = trainer.log_every_n_steps
    return bool(every) and (loop._batches_that_stepped + 1) % every == 0


def nanmedian_columns(x: torch.Tensor) -> torch.Tensor:
    """``x.nanmedian(dim=0).values`` for a (N, C) tensor: each column's lower middle value among its non-NaN
    entries, NaN for a column of NaNs. By a sort (NaN sorts last), as torch's median with indices has no
    deterministic CUDA kernel: ``--trainer.deterministic true`` on a GPU raised at the guard's first refresh."""
    counted = (~x.isnan()).sum(dim=0)  # (C,)
    middle = ((counted - 1).clamp(min=0) // 2).unsqueeze(0)  # (1, C)
    return x.sort(dim=0).values.gather(0, middle).squeeze(0)  # (C,)


def _skip_update(optimizer: Any, skip: torch.Tensor) -> None:
    """Make the optimizer's coming update a no-op when ``skip`` (a 0-dim bool tensor) is true."""
    optimizer = getattr(optimizer, "_optimizer", optimizer)  # (Lightning's wrapper)
    if isinstance(optimizer, torch.optim.Adam) and all(g.get("fused") for g in optimizer.param_groups):
        # the fused kernel leaves parameters, moments and its step count untouched where found_inf is non-zero
        optimizer.found_inf = skip.float()
    elif skip.item():  # (Muon, foreach AdamW: parameters without a gradient are left as they are)
        optimizer.zero_grad(set_to_none=True)


def last_good_checkpoint(trainer: L.Trainer, first_bad: int,
                         abandoned: Iterable[tuple[int, int]] = ()) -> Path | None:
    """The newest checkpoint of the run's checkpoint folders whose weights have not seen step index ``first_bad``
    (a checkpoint of N steps has seen indices 0 .. N - 1: N <= first_bad) and were not abandoned by a rollback
    (``abandoned``: (lo, hi) spans of steps; the run never trains those steps again, so a checkpoint of one is of
    the abandoned weights), or None."""
    from tinylm.checkpoint_steps import checkpoints_by_step

    dirs = {Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
    saved = sorted((step, not last, str(path)) for d in dirs for step, last, path in checkpoints_by_step(d)[0]
                   if step <= first_bad and not any(lo < step < hi for lo, hi in abandoned))
    return Path(saved[-1][2]) if saved else None


def grad_scaler(trainer: Any) -> Any:
    """The GradScaler of ``trainer``'s precision (16-mixed), else None."""
    return getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
