"""A training-health monitor: failures that look like training but are not, said in one line each.

Each alert goes to the console (a warning), to the CSV/W&B metrics as ``health/<kind> = 1`` at its step, and to W&B
as an alert. Non-finite loss or gradients stop the run (before a checkpoint can save broken weights).

Detectors, with what they usually mean:
- ``stuck``: loss still near ln(vocab) after warmup: LR zero, frozen parameters, or uniformly random data (targets
  unrelated to their inputs still teach the token frequencies: a loss near the unigram entropy, not caught here).
- ``leak``: loss far below what text allows, very early: targets leaking into inputs (y not shifted by one).
- ``nonfinite``: NaN/Inf loss or gradient norm: LR too high, fp16 overflow (use bf16-mixed), bad data. (Under
  ``16-mixed`` non-finite gradients of a finite loss are GradScaler's to skip: not judged.)
- ``spike``: gradient norm far above its running median: a bad batch or an LR on the edge of stability.
- ``diverged``: validation loss far above ln(vocab) (worse than guessing uniformly): the run blew up. A run whose
  last validation diverged ends with a TrainingHealthError (exit 1), after its checkpoints are saved.
- ``overfit``: validation loss rising for several evaluations while training loss falls.
- ``slowdown``: tokens/sec falling steadily: a memory leak, growing Python state, thermal throttling. Judged only
  while other processes keep the run waiting for CPUs less than ``contention_margin`` of the time (on a shared
  machine the rate follows the other jobs): neither wall nor CPU time can tell a busier machine from a slower run
  (idle OpenMP threads spin, and time slices shared with other jobs cost cache refills: the run's own time per step
  rose 20-50% in tests). So the reference rate is also only compared with windows where other processes kept about
  as many CPUs busy as when it was taken (``load_margin``): other jobs starting or ending start a new reference.
- ``contention``: the run waited for CPUs held by other processes most of the time: it runs at their pace; fewer
  torch threads (``--run.threads 1``) lose less at each operator's barrier.

Loss and gradient norm stay tensors on the device until ``sync_every`` steps have gathered, then are read with one
device synchronisation (a ``float()`` per step would stall a GPU's queue every step); pending values are always
checked before a checkpoint is written and at the end of training.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from tinylm.device import precision_dtypes, usable_cpus
from tinylm.errors import TinyLMError
from tinylm.train.guard import DIVERGED_FACTOR, grad_scaler

log = logging.getLogger("tinylm")


class TrainingHealthError(TinyLMError, RuntimeError):
    """Raised when training cannot go on (non-finite loss or gradients), by every rank together (the ranks agree on
    the health checks)."""

    every_rank = True


@dataclass
class Alert:
    step: int
    kind: str
    message: str


class HealthMonitor(L.Callback):
    """Watches loss, gradient norm, validation loss and throughput for the classic silent failures.

    Args:
        stuck_tolerance: ``stuck`` fires when the mean recent loss is within this fraction of ln(vocab).
        stuck_after: Optimizer steps after warmup before ``stuck`` is checked.
        leak_fraction: ``leak`` fires when the loss falls below this fraction of ln(vocab)...
        leak_within: ...within this many optimizer steps of the start.
        spike_factor: ``spike`` fires when the grad norm exceeds this multiple of its running median.
        spike_window: Optimizer steps in the running median (spikes are judged once it holds 10 of them, or all of
            them if fewer).
        overfit_patience: ``overfit`` fires after this many consecutive rising validation losses while the
            training loss fell over the same span.
        slowdown_fraction: ``slowdown`` fires when recent tokens/sec stays below (1 - this) of the reference rate
            (the best ``window``-step median so far) for ``window`` readings of it (every optimizer step on a CPU,
            every logging step on a GPU)...
        contention_margin: ...judged only while the run waited for CPUs held by other processes less than this
            fraction of the time: on a machine loaded by other jobs the rate moves with them (measured: 230 to
            2,400 tokens/sec, steps alike, at one steady 60 % wait), not with the run...
        load_margin: ...and only against a reference taken while other processes kept as many CPUs busy, within this
            many CPUs (a job that started beside a healthy run slowed it 30-40% at a wait under 20%: no slowdown).
        contention_alert: ``contention`` fires (once) when the run waited for CPUs more than this fraction of the
            time over ``window`` steps.
        window: Optimizer steps averaged for loss and throughput comparisons.
        halt_on_nonfinite: Stop the run on NaN/Inf loss or gradients (raise :class:`TrainingHealthError`), and end a
            run whose last validation diverged with that error too (after its checkpoints are saved).
        diverged_factor: ``diverged`` fires when val/loss exceeds this multiple of ln(vocab) (what a model that
            guesses uniformly scores; a trained model is far below it) while the training loss is above ln(vocab)
            too (else it is overfitting); None turns the check off.
        sync_every: Optimizer steps whose loss and grad norm are read from the device together (None:
            ``trainer.log_every_n_steps``); a non-finite value stops the run at the latest then, and always before a
            checkpoint is saved.
    """

    def __init__(
        self,
        *,
        stuck_tolerance: float = 0.05,
        stuck_after: int = 100,
        leak_fraction: float = 0.05,
        leak_within: int = 1000,
        spike_factor: float = 10.0,
        spike_window: int = 50,
        overfit_patience: int = 3,
        slowdown_fraction: float = 0.3,
        contention_margin: float = 0.2,
        load_margin: float = 0.5,
        contention_alert: float = 0.5,
        window: int = 20,
        halt_on_nonfinite: bool = True,
        diverged_factor: float | None = DIVERGED_FACTOR,
        sync_every: int | None = None,
    ) -> None:
        if sync_every is not None and sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 (or None: trainer.log_every_n_steps), got {sync_every}")
        self.stuck_tolerance = stuck_tolerance
        self.stuck_after = stuck_after
        self.leak_fraction = leak_fraction
        self.leak_within = leak_within
        self.spike_factor = spike_factor
        self.spike_window = spike_window
        self.overfit_patience = overfit_patience
        self.slowdown_fraction = slowdown_fraction
        self.contention_margin = contention_margin
        self.load_margin = load_margin
        self.contention_alert = contention_alert
        self.window = window
        self.halt_on_nonfinite = halt_on_nonfinite
        self.diverged_factor = diverged_factor
        self._diverged: str | None = None  # the last validation's divergence, said again as the run's error
        self._sane_val_step = -1  # the step of the last validation that did not diverge
        self.sync_every = sync_every
        self._pending: list[tuple] = []  # (step, loss, grad norm or None, guard's skip or None) unread
        self._step_seen = -1  # trainer.global_step at the last batch judged: a new value is a new optimizer step
        self.alerts: list[Alert] = []
        self._fired: set[str] = set()
        self._losses: deque[float] = deque(maxlen=window)
        self._norms: deque[float] = deque(maxlen=spike_window)
        self._val: list[tuple[float, float]] = []  # (val loss, mean train loss at that time)
        self._best_rate: float | None = None
        self._rates: deque[float] = deque(maxlen=window)
        self._shares: deque[float] = deque(maxlen=window)  # share of the CPUs the run got, beside each rate
        self._others: deque[float] = deque(maxlen=window)  # CPUs other processes kept busy, beside each rate
        self._best_others: float | None = None  # ... when the reference rate was taken
        self.load_changes = 0  # references dropped because other jobs started or ended
        self._rates_seen: int | None = None  # the speed monitor's marks_taken when its rate was last read
        self._slow_streak = 0
        self.contended_windows = 0  # throughput windows not judged: other processes held the CPUs
        self._last_spike_step = -(10**9)
        self._last_good_step = -1
        self._owner: tuple[L.Trainer, L.LightningModule] | None = None  # set at train start, for state_dict

    # ---- reporting ----------------------------------------------------------------------------------------------
    def _alert(self, trainer: L.Trainer, kind: str, message: str, *, once: bool = True,
               step: int | None = None, said: bool = True) -> None:
        """Record an alert (the run's CSV column ``health/KIND``, a W&B alert) and, when ``said``, warn of it (not
        when the error that ends the run says the same)."""
        if once and kind in self._fired:
            return
        self._fired.add(kind)
        step = trainer.global_step if step is None else step  # optimizer steps done, as in step-N.ckpt
        self.alerts.append(Alert(step, kind, message))
        if trainer.is_global_zero:
            if said:
                log.warning("tinylm health [%s] step %d: %s", kind, step, message)
            for logger in trainer.loggers:  # in the row of the step's own metrics: they are logged one behind
                logger.log_metrics({f"health/{kind}": 1.0}, step=max(step - 1, 0))
                experiment = getattr(logger, "experiment", None)
                if isinstance(logger, WandbLogger) and hasattr(experiment, "alert"):
                    try:
                        experiment.alert(title=f"tinylm: {kind}", text=f"step {step}: {message}")
                    except Exception as e:  # noqa: BLE001 (best-effort: offline runs cannot send alerts)
                        log.debug("W&B alert not sent: %s", e)

    # ---- training -----------------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if trainer.global_step == self._step_seen:
            return  # mid-accumulation: the optimizer step is judged once it is taken
        self._step_seen = trainer.global_step
        # the step's loss (the mean of its micro-batches); Lightning's `outputs` hold the last micro-batch's loss
        # divided by accumulate_grad_batches, which made `stuck` unable to fire and `leak` fire at step 0
        loss_t = pl_module.step_loss
        if loss_t is None:
            return
        norm_t = getattr(pl_module, "last_grad_norm", None)
        skipped_t = getattr(pl_module, "step_skipped", None)  # the stability guard's: a skipped step is its to tell
        self._pending.append((trainer.global_step, loss_t.detach(), None if norm_t is None else norm_t.detach(),
                              None if skipped_t is None else skipped_t.detach()))
        self._throughput(trainer)
        if len(self._pending) >= (self.sync_every or trainer.log_every_n_steps or 1):
            self._check_pending(trainer, pl_module)

    def _check_pending(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read the pending losses and grad norms in one device sync, then judge them step by step, in order."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        values = [loss.float().reshape(()) for _, loss, _, _ in pending]
        values += [norm.float().reshape(()) for _, _, norm, _ in pending if norm is not None]
        values += [skip.float().reshape(()) for *_, skip in pending if skip is not None]  # (the same on every rank)
        values = torch.stack(values)
        if trainer.world_size > 1:  # each rank's loss is its own batch's: judge the mean, every rank the same values
            values = trainer.strategy.reduce(values, reduce_op="mean")  # (one rank's NaN is every rank's halt)
        flat = iter(values.tolist())
        losses = [next(flat) for _ in pending]
        norms = [None if norm_t is None else next(flat) for _, _, norm_t, _ in pending]
        for (step, *_, skip_t), loss, norm in zip(pending, losses, norms, strict=True):
            if skip_t is not None and next(flat):  # not applied: the weights are as before it (the guard logs and acts)
                continue
            self._check(trainer, pl_module, step, loss, norm)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._check_pending(trainer, pl_module)  # raises before a non-finite run's weights reach the file

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_pending(trainer, pl_module)
        self._end_diverged()

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, loss: float,
               norm: float | None) -> None:
        if norm is not None and math.isfinite(loss) and not math.isfinite(norm) \
                and grad_scaler(trainer) is not None:
            return  # 16-mixed's GradScaler skipped this fp16 overflow itself and lowered its scale: no divergence
        if not math.isfinite(loss) or (norm is not None and not math.isfinite(norm)):
            self._nonfinite(trainer, loss, norm, step)
            return
        self._last_good_step = step
        self._losses.append(loss)
        ln_v = math.log(pl_module.hparams.vocab_size)
        warmup = getattr(pl_module.hparams, "warmup_steps", 0)
        mean = sum(self._losses) / len(self._losses)

        # near ln(vocab), on either side (far above it the run is blowing up, which is no zero LR: the guard and
        # `diverged` judge that)
        if (step >= warmup + self.stuck_after and len(self._losses) == self.window
                and abs(mean - ln_v) < self.stuck_tolerance * ln_v):
            self._alert(
                trainer,
                "stuck",
                f"loss {mean:.3f} is still near ln(vocab)={ln_v:.3f} after warmup: check that the LR is not zero, "
                "that parameters require grad, and that the data is not random",
                step=step,
            )
        if (step <= self.leak_within and loss < self.leak_fraction * ln_v and len(self._losses) >= 3
                and mean < self.leak_fraction * ln_v):
            self._alert(
                trainer,
                "leak",
                f"loss {mean:.4f} after only {step} steps is far below what text allows (ln(vocab)={ln_v:.2f}): "
                "check that targets are the inputs shifted by one token and that validation does not overlap training",
                step=step,
            )
        if norm is not None:
            if len(self._norms) >= min(10, self.spike_window):
                median = statistics.median(self._norms)
                if (median > 0 and norm > self.spike_factor * median
                        and step - self._last_spike_step >= self.spike_window):
                    self._last_spike_step = step
                    self._alert(
                        trainer,
                        "spike",
                        f"grad norm {norm:.3g} is {norm / median:.0f}x its running median {median:.3g}: a bad batch or "
                        "an LR near the edge of stability (lower lr, longer warmup, check gradient_clip_val)",
                        once=False,
                        step=step,
                    )
            self._norms.append(norm)

    def _nonfinite(self, trainer: L.Trainer, loss: float, norm: float | None, step: int) -> None:
        history = ", ".join(f"{n:.3g}" for n in list(self._norms)[-8:]) or "none yet"
        precision = str(trainer.precision)
        fp16 = f" With {precision}, fp16 overflow is likely: use bf16-mixed." \
            if precision_dtypes(precision)[1] == torch.float16 else ""
        message = (
            f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} (loss={loss}, grad_norm={norm}); "
            f"last finite step {self._last_good_step} (loss and gradient norm; global_step, as in step-N.ckpt); "
            "recent grad norms "
            f"[{history}]. Likely causes: LR too high "
            f"(lower lr or lengthen warmup), missing gradient clipping, or corrupt data.{fp16} After fixing, "
            + _restart_hint(trainer, self._last_good_step)
        )
        self._alert(trainer, "nonfinite", message, step=step, said=not self.halt_on_nonfinite)
        if self.halt_on_nonfinite:
            raise TrainingHealthError(message)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._speed = next((cb for cb in trainer.callbacks if hasattr(cb, "tokens_per_sec")), None)
        self._step_seen = trainer.global_step
        # a resumed run's checkpoint passed these checks when it was saved: a divergence in the first step after a
        # resume still has the checkpoints before it to restart from
        self._last_good_step = trainer.global_step
        self._owner = (trainer, pl_module)  # Lightning calls state_dict without them

    def _throughput(self, trainer: L.Trainer) -> None:
        speed = getattr(self, "_speed", None)
        rate = getattr(speed, "tokens_per_sec", None)
        taken = getattr(speed, "marks_taken", None)
        if rate is None or (taken is not None and taken == self._rates_seen):
            return  # no new rate since the last step (on a GPU, rates are taken on logging steps only)
        self._rates_seen = taken
        self._rates.append(float(rate))
        self._shares.append(min(1.0, max(0.01, 1.0 - (getattr(speed, "cpu_wait_fraction", None) or 0.0))))
        if (others := getattr(speed, "others_busy", None)) is not None:
            self._others.append(float(others))
        if len(self._rates) < self.window:
            return
        current, share = statistics.median(self._rates), statistics.median(self._shares)
        others = statistics.median(self._others) if len(self._others) == len(self._rates) else None
        if share < 1 - self.contention_alert:
            self._contention(trainer, 1 - share, others)
        if share < 1 - self.contention_margin:
            # other jobs hold the CPUs: the rate follows them, and by more than the share (a torch thread that
            # waits for a CPU keeps its peers spinning at the next barrier), so it says nothing about the run
            self._slow_streak = 0
            self.contended_windows += 1
            return
        load_changed = (others is not None and self._best_others is not None
                        and abs(others - self._best_others) > self.load_margin)
        if self._best_rate is None or current > self._best_rate or load_changed:
            # the reference is the best window so far: a first window caught in a dip (a validation, the page cache
            # warming up) would hide a real slowdown later. Other jobs that started (or ended) since it was taken
            # make a new one: the rate moved with them, not with the run
            self.load_changes += load_changed
            self._best_rate, self._best_others, self._slow_streak = current, others, 0
            return
        # sustained: `window` judged steps in a row (a load arriving moves the rate a little before the share)
        self._slow_streak = self._slow_streak + 1 if current < (1 - self.slowdown_fraction) * self._best_rate else 0
        if self._slow_streak >= self.window:
            self._alert(
                trainer,
                "slowdown",
                f"tokens/sec fell from {self._best_rate:,.0f} to {current:,.0f} while the training process seldom "
                "waited for a CPU: look for a memory leak (tensors kept across steps, growing lists), data loading "
                "stalls (other jobs can still starve the loader's worker processes, which this does not measure), or "
                "thermal throttling",
            )

    def _contention(self, trainer: L.Trainer, wait: float, others: float | None) -> None:
        threads = torch.get_num_threads()
        busy = f" (other processes kept {others:.1f} CPUs busy)" if others is not None else ""
        fix = (f"--run.threads 1 (this run has {threads}: each waits at every operator for the slowest) or "
               if threads > 1 else "")
        self._alert(trainer, "contention",
                    f"the run waited for CPUs held by other processes {wait:.0%} of the time{busy} on "
                    f"{usable_cpus()} CPUs: it runs at their pace, not its own. Use {fix}a quieter machine")

    # ---- validation ---------------------------------------------------------------------------------------------
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check_pending(trainer, pl_module)
        val = trainer.callback_metrics.get("val/loss")
        if trainer.sanity_checking or val is None:
            return
        self._judge_val(trainer, pl_module, float(val))
        if not self._losses:
            return
        train = sum(self._losses) / len(self._losses)
        k = self.overfit_patience
        # only the last k + 1 are judged: the whole history grew by one tuple per validation, in memory and in every
        # checkpoint, for as long as the run went on
        self._val = [*self._val, (float(val), train)][-(k + 1):]
        if len(self._val) <= k:
            return
        recent = self._val[-(k + 1) :]
        val_rising = all(b[0] > a[0] for a, b in itertools.pairwise(recent))
        train_falling = recent[-1][1] < recent[0][1]
        if val_rising and train_falling:
            self._alert(
                trainer,
                "overfit",
                f"val loss rose {k} evaluations in a row ({recent[0][0]:.3f} -> {recent[-1][0]:.3f}) "
                f"while train loss fell ({recent[0][1]:.3f} -> {recent[-1][1]:.3f}): overfitting; "
                "use more data, dropout, or stop at best.ckpt",
            )

    def _judge_val(self, trainer: L.Trainer, pl_module: L.LightningModule, val: float) -> None:
        """``diverged``: val/loss far above ln(vocab), what a model that guesses uniformly scores."""
        vocab_size = getattr(getattr(pl_module, "hparams", None), "vocab_size", None)
        if not vocab_size:  # (a module that is not a language model of a known vocabulary)
            return
        ln_v = math.log(vocab_size)
        train = sum(self._losses) / len(self._losses) if self._losses else math.inf
        # (a model that memorised its training set can score worse than uniform on held-out text: that is overfit)
        if (self.diverged_factor is None or (math.isfinite(val) and val <= self.diverged_factor * ln_v)
                or train <= ln_v):
            self._diverged, self._sane_val_step = None, trainer.global_step
            return
        before = "; ".join(f"{a.kind} at step {a.step}" for a in self.alerts[:3]) or "no alert before it"
        from tinylm.train.guard import StabilityGuard

        guard = next((cb for cb in trainer.callbacks if isinstance(cb, StabilityGuard) and cb.enabled), None)
        guarded = ("--guard.enabled true skips bad steps and rolls back" if guard is None else
                   f"the stability guard was on and could not hold it ({guard.skipped} step(s) skipped, "
                   f"{guard.rollbacks} rollback(s))")
        self._diverged = (
            f"the run diverged: val/loss {val:.4g} at step {trainer.global_step} is far above ln(vocab)={ln_v:.2f}, "
            f"what a model that guesses uniformly scores ({before}). Likely causes: LR too high (lower lr or muon_lr, "
            f"lengthen warmup), missing gradient clipping, or corrupt data; {guarded}. After fixing, "
            + _restart_hint(trainer, self._sane_val_step + 1))
        self._alert(trainer, "diverged", self._diverged)

    def _end_diverged(self) -> None:
        """A run whose last validation diverged ends with the reason as an error, not exit 0."""
        if self._diverged is not None and self.halt_on_nonfinite:
            raise TrainingHealthError(self._diverged)

    # ---- state survives resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        # Lightning collects callback states before on_save_checkpoint: judge what is pending first, so that an alert
        # it raises is in this checkpoint (a resume from it would raise it again) and NaN stops the save here
        if self._owner is not None:
            self._check_pending(*self._owner)
        # (not `slowdown`'s reference rate: a rate is the process's that measured it, on its ranks and machine; a
        # resume on 1 device of a 2-device run read half of it, and was told of a slowdown)
        return {"fired": sorted(self._fired), "val": [list(v) for v in self._val],
                "sane_val_step": self._sane_val_step, "losses": list(self._losses),
                "norms": list(self._norms), "last_spike_step": self._last_spike_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self._fired = set(state_dict.get("fired", []))
        self._val = [tuple(v) for v in state_dict.get("val", [])]
        self._sane_val_step = int(state_dict.get("sane_val_step", -1))  # (an older checkpoint's best_rate: unread)
        # the recent training losses that a validation is judged beside (`diverged`) and `stuck` reads, and the
        # gradient norms: a resumed run judged its first validations on its own few steps and ended "diverged" where
        # the straight run did not
        self._losses = deque(state_dict.get("losses", []), maxlen=self.window)
        self._norms = deque(state_dict.get("norms", []), maxlen=self._norms.maxlen)  # (`spike`'s running median)
        self._last_spike_step = int(state_dict.get("last_spike_step", -(10**9)))  # (`spike`: one per spike_window)


def _restart_hint(trainer: L.Trainer, last_good_step: int) -> str:
    """How to go on after a divergence: a new run from the newest weights saved before it (step-N, best or last
    .ckpt, by the step inside). Not a resume, which keeps the checkpoint's lr and other model settings (and, with
    changed data, is refused)."""
    from tinylm.checkpoint_steps import checkpoints_by_step

    dirs = {Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
    saved = sorted((step, path) for d in dirs for step, _, path in checkpoints_by_step(d)[0] if step < last_good_step)
    if not saved:
        return "start again under a new --run.name (the run saved no checkpoint before the divergence)."
    return (f"start a new run from the newest weights saved before it: --model.init_from {saved[-1][1]} --run.name "
            "NEW_NAME (a resume, --ckpt_path, would keep the checkpoint's lr and other model settings).")
