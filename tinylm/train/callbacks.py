"""Training callbacks: throughput and MFU, RNG state for exact resume, the logging step on resume, the final validation,
the best and periodic checkpoints (the bar: progress_bar)."""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tinylm import continued
from tinylm.device import others_cpu_seconds, peak_flops_by_name, precision_dtypes
from tinylm.train.loggers import RunCSVLogger
from tinylm.train.module import host_scalar, logging_step


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Dense peak FLOP/s of ``device`` at ``precision`` (a Lightning precision string), or None when unknown (CPUs).

    tinylm's table (tinylm.device.PEAK_BF16, then Lightning's by chip name) first; Lightning's `get_available_flops`
    parses a few more device names (GeForce, Tesla) as the fallback."""
    if device.type != "cuda":
        return None
    flops = peak_flops_by_name(torch.cuda.get_device_name(device), precision)
    if flops:
        return flops
    try:  # (its fp32 entry follows torch.get_float32_matmul_precision, as ours)
        from lightning.fabric.utilities.throughput import get_available_flops

        flops = get_available_flops(device, precision_dtypes(precision)[1])
    except Exception:  # noqa: BLE001 (the lookup is best-effort: an unknown device has no peak, no MFU)
        flops = None
    return float(flops) if flops else None


def cpu_wait_seconds() -> float | None:
    """Seconds this process's threads together spent runnable but waiting for a CPU, or None where unknown.

    Linux's scheduler statistics (``/proc/self/task/*/schedstat``, second field): time that *other* processes held
    the CPUs, which says nothing about the run itself.
    """
    total = 0
    try:
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"{task.path}/schedstat") as f:
                    total += int(f.read().split()[1])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def work_mark() -> tuple[float, float | None, float | None]:
    """(wall time, this process's CPU wait, other processes' CPU seconds) now: where work that is no training
    (validating, sampling text) begins, for `SpeedMonitor.exclude` to leave it out."""
    return time.perf_counter(), cpu_wait_seconds(), others_cpu_seconds()


def _gap(before: tuple, after: tuple) -> list:
    """``after - before`` item by item (None where either is None: a counter this machine lacks)."""
    return [None if a is None or b is None else b - a for a, b in zip(before, after)]


def _plus(value: float | None, delta: float | None) -> float | None:
    return value if value is None or delta is None else value + delta


class SpeedMonitor(L.Callback):
    """Logs ``train/tokens_per_sec`` (all ranks together) and ``train/mfu`` (per device, when its peak is known).

    Rates are averaged over the last ``window`` optimizer steps (on a GPU: the last ``window`` logging intervals, as a
    rate needs a device sync, taken only on logging steps), so a slow first step (compilation, warm-up) fades
    out of the number instead of hiding in it. For the health monitor it also keeps ``cpu_wait_fraction``: the share
    of the window's wall time, per torch thread, that this process's threads waited for a CPU held by other
    processes (None where the OS does not say), so that a machine loaded by other jobs is not taken for a slower run.

    Lightning's ``ThroughputMonitor`` does not replace this: it logs under its own names (``train/items_per_sec``,
    ``train/device/mfu``) with no way to rename them short of overriding its private ``_compute``, writes straight to
    the loggers (so nothing reaches the progress bar), keeps its rates in private state (the health monitor needs
    them), and reports only after ``window_size`` batches. tinylm's metric names are part of its contract.

    Args:
        window: Number of optimizer steps to average over (time spent validating excluded).
    """

    def __init__(self, *, window: int = 10) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        # (time, tokens, CPU wait, other processes' CPU seconds)
        self._marks: deque[tuple[float, int, float | None, float | None]] = deque(maxlen=window + 1)
        self._tokens = 0
        self._step_seen = -1
        self._flops_per_token = 0.0
        self._peak: float | None = None
        self._validating_since: tuple[float, float | None, float | None] | None = None  # work_mark()
        self.tokens_per_sec: float | None = None  # latest rate, all ranks together (read by the health monitor)
        self.marks_taken = 0  # how many rates were taken: the health monitor reads each new one once
        self.cpu_wait_fraction: float | None = None  # over the same window (read by the health monitor)
        self.others_busy: float | None = None  # CPUs other processes kept busy over the window (health monitor)
        self._cpu_counters: tuple[float | None, float | None] | None = None  # read before a GPU step's wait
        self._stops = continued.Stops()  # stopped and continued since the last mark (made again at the run's start)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flops_per_token = pl_module.model.flops_per_token()
        self._peak = peak_flops(pl_module.device, str(trainer.precision))
        self._marks.clear()
        self._tokens = 0
        self._step_seen = trainer.global_step
        self._stops = continued.Stops()

    # validation time is no training time: the window's marks move forward by it (tokens/sec and MFU fell ~4.5x for
    # the 10 steps after each validation, and the health monitor took that for a slowdown)
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._validating_since = work_mark()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validating_since is not None:
            self.exclude(self._validating_since)
            self._validating_since = None

    def exclude(self, since: tuple[float, float | None, float | None]) -> None:
        """Leave the work done since ``since`` (`work_mark()` as it began: validating, sampling text) out of the rates:
        its wall time, and its CPU wait and other processes' CPU seconds (left in, divided by the training time alone,
        they made the window after each validation wait for CPUs ~all the time, other jobs busy on more CPUs than
        the machine has)."""
        seconds, wait, others = _gap(since, work_mark())
        self._shift(seconds, 0, wait, others)

    def _leave_out_since_last(self, mark: tuple[float, int, float | None, float | None]) -> None:
        """Leave the interval from the last mark to ``mark`` out of the window (its time, tokens and CPU counters):
        the process was stopped in it (Ctrl+Z, kill -STOP, SLURM's suspend; `tinylm.continued`). Counted, a 20 s
        stop logged tokens/sec 126 for ~9,000 in the rows of the 10-step window it fell in."""
        if self._marks:
            self._shift(*_gap(self._marks.pop(), mark))

    def _shift(self, seconds: float, tokens: int, wait: float | None, others: float | None) -> None:
        """Move the window's marks forward by an interval left out of it (its time, tokens and CPU counters)."""
        self._marks = deque(((t + seconds, n + tokens, _plus(w, wait), _plus(o, others))
                             for t, n, w, o in self._marks), maxlen=self._marks.maxlen)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        # The CPU counters of a GPU step's mark are read here, while the GPU still runs the step's backward: read
        # with the mark, after the wait for the GPU, they left it idle for ~2.4 ms of every logged 124M step on an
        # H200 (one /proc file per thread; benchmarks/gpu/profile_fit.py)
        if pl_module.device.type == "cuda" and logging_step(trainer):
            self._cpu_counters = (cpu_wait_seconds(), others_cpu_seconds())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        self._tokens += batch[0].numel()
        if trainer.global_step == self._step_seen:
            return  # still accumulating gradients: no optimizer step yet
        self._step_seen = trainer.global_step
        logs = logging_step(trainer)
        counters, self._cpu_counters = self._cpu_counters, None
        if pl_module.device.type == "cuda":
            # a mark times finished work, not queued kernels: it waits for the GPU, which leaves it idle while the
            # host prepares the next step. Marks are taken only on the steps whose rate is logged, so that the steps
            # in between queue their kernels and go on (tests/gpu/test_gpu.py counts the syncs)
            if not logs:
                return
            torch.cuda.synchronize(pl_module.device)
        if counters is None:
            counters = (cpu_wait_seconds(), others_cpu_seconds())
        mark = (time.perf_counter(), self._tokens, *counters)
        if self._stops.since():
            self._leave_out_since_last(mark)
        self._marks.append(mark)
        self.marks_taken += 1
        if len(self._marks) < 2:
            return
        (t0, n0, w0, o0), (t1, n1, w1, o1) = self._marks[0], self._marks[-1]
        per_device = (n1 - n0) / max(t1 - t0, 1e-9)
        self.tokens_per_sec = per_device * trainer.world_size
        if w0 is not None and w1 is not None:
            self.cpu_wait_fraction = (w1 - w0) / max(t1 - t0, 1e-9) / torch.get_num_threads()
        if o0 is not None and o1 is not None:
            self.others_busy = max(0.0, (o1 - o0) / max(t1 - t0, 1e-9))
        if not logs:
            return
        pl_module.log("train/tokens_per_sec", host_scalar(self.tokens_per_sec), prog_bar=True, rank_zero_only=True)
        if self._peak:
            pl_module.log("train/mfu", host_scalar(per_device * self._flops_per_token / self._peak),
                          rank_zero_only=True)


class RNGState(L.Callback):
    """Puts every random number generator (python, numpy, torch, CUDA) into the checkpoint and restores it on resume.

    Lightning's checkpoint holds no RNG state, so with dropout a resumed run draws different masks than the
    uninterrupted one. The state is restored at the *first training batch* after loading, not at ``on_train_start``:
    the training DataLoader's iterator is created in between and would otherwise run on the restored state.
    Only tensors and plain Python values are stored, so ``torch.load(weights_only=True)`` can read it back.

    Each rank of a multi-device run draws its own dropout masks, as nanoGPT's ranks do (seed + rank): every rank is
    seeded alike (the same initial weights), and rank r > 0 moves to seed + r at its first batch; a checkpoint holds
    every rank's torch and CUDA states (rank 0's alone gave each rank the same masks: rows of the global batch
    dropped alike in pairs). A failure's checkpoint (Lightning's OnExceptionCheckpoint) holds rank 0's alone: the
    failure may have reached one rank, and a collective with ranks that never join it hangs the run for good.
    """

    def __init__(self) -> None:
        self._pending: dict | None = None
        self._first = False
        self._failed = False  # an exception ends the run: its checkpoint gathers no other rank's state

    def state_dict(self) -> dict:
        import random

        import numpy as np

        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        version, py_state, py_gauss = random.getstate()
        own = [torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []]
        return {
            "python": [version, list(py_state), py_gauss],
            "numpy": [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(gauss)],
            "torch": own[0],
            "cuda": own[1],
            "ranks": None if self._failed else _every_rank(own),  # (every rank saves: a collective)
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self._pending = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first, self._failed = True, False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._failed = True  # (before a checkpoint callback's save: Lightning calls those last)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if not self._first:
            return
        import random

        import numpy as np

        s, self._pending, self._first = self._pending, None, False
        if s is not None:
            version, py_state, py_gauss = s["python"]
            random.setstate((version, tuple(py_state), py_gauss))
            kind, keys, pos, has_gauss, gauss = s["numpy"]
            np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
        ranks = (s or {}).get("ranks")
        if ranks is not None and len(ranks) == trainer.world_size:
            cpu, cuda = ranks[trainer.global_rank]
        elif trainer.global_rank > 0:  # a new run, or another number of ranks: rank r's own stream from the seed
            torch.manual_seed((torch.initial_seed() + trainer.global_rank) % 2**64)
            return
        elif s is None:
            return
        else:
            cpu, cuda = s["torch"], s["cuda"]
        torch.set_rng_state(cpu)
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _every_rank(value: Any) -> list | None:
    """``value`` of every rank of the run's process group, by rank (a collective), or None without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


class LoggedStep(L.Callback):
    """Keeps the step that metrics are logged under equal to the optimizer steps done, across a resume.

    Lightning logs under its own counter (the fit loop's ``_batches_that_stepped``, one behind ``global_step`` while
    a step's metrics are written). On resume it restores that counter and corrects it by guessing where in a batch
    the checkpoint was saved; the guess is off by one for a checkpoint saved after a validation that ran only because
    the run was stopping (EarlyStopping or ``--trainer.max_time`` between two scheduled validations), or after the
    epoch ended. The resumed run then logged every step under its neighbour's label: two CSV rows under one step, and
    W&B refusing a step lower than its last. Before the first batch of a run the counter equals ``global_step``.
    """

    def __init__(self) -> None:
        self._first = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first = True

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self._first:  # here, not at on_train_start: Lightning makes its correction in between
            self._first = False
            trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # ddp_fork's training processes hand the launching process their callback_metrics, not their loops (its
        # trainer stays at step 0): the step the run reached goes back with them, for the run's summary
        trainer.callback_metrics[REACHED_STEP] = torch.tensor(trainer.global_step)


REACHED_STEP = "tinylm/reached_step"
"""The key of the step a fit reached in ``trainer.callback_metrics`` (set by LoggedStep at the end of the fit)."""


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the current training batch (ask in ``on_train_batch_end``).

    Lightning's own test (``_should_check_val_fx``): the same interval, epoch and last-batch rules it applies.
    """
    loop = trainer.fit_loop
    return loop._data_fetcher is not None and loop.epoch_loop._should_check_val_fx(loop._data_fetcher)


def scheduled_validation_follows(trainer: L.Trainer) -> bool:
    """`validation_follows`, leaving out the one validation Lightning adds where a run stops between two scheduled
    ones (`--trainer.max_time`, EarlyStopping): that one is not part of the run's schedule."""
    stop, trainer.should_stop = trainer.should_stop, False
    try:
        return validation_follows(trainer)
    finally:
        trainer.should_stop = stop


class FinalValidation(L.Callback):
    """The run's last optimizer step (``trainer.max_steps``) logs its training metrics and validates, whatever
    ``log_every_n_steps`` and ``val_check_interval`` say: a quick try of 100 steps at ``val_check_interval`` 250
    ended with no ``val/loss`` and no ``best.ckpt``, and GPT-2's 19,073 steps at 250 without the final model's
    ``val/loss``.

    Lightning's rule for a stop does both: a batch that ends with ``trainer.should_stop`` set (as EarlyStopping sets
    it) is a logging step (`logging_step`), and validation follows it. It is set at the start of the step's last
    micro-batch, so that the step's own metrics are logged (set after the batch, Lightning logged the previous
    logging step's values again, under this step). The run ends at ``max_steps`` anyway. As at any stop between two
    scheduled validations, the step's checkpoint is saved before this validation (`PeriodicCheckpoint`), so a resume
    with a larger ``max_steps`` goes on exactly.
    """

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        ends_the_run = (trainer.global_step + 1 == trainer.max_steps
                        and not trainer.fit_loop.epoch_loop._should_accumulate())
        if ends_the_run:  # (max_steps -1, unset: never)
            trainer.should_stop = True


class _RunFolderCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint of the run folder's ``checkpoints/``, which follows the folder when it moves: Lightning
    drops the best score and the kept files of a state whose ``dirpath`` is not its own (right for a branch into a
    new folder), and a run folder moved or copied (``mv runs/a runs/b``, another mount point) and resumed had its
    better best.ckpt replaced by the next validation's and its step-N files never trimmed again. ``continues``
    (set when the run resumes a checkpoint of its own folder) reads that state with its paths moved here."""

    continues = False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        was, now = state_dict.get("dirpath"), self.dirpath
        if self.continues and was and now and was != now:
            state_dict = moved_state(state_dict, str(was), str(now))
        super().load_state_dict(state_dict)
        self._keep_own_files()

    def _keep_own_files(self) -> None:
        """Only checkpoints of this folder in the lists of files the callback removes as newer ones come
        (run.keep_checkpoints, a better best.ckpt, the previous last.ckpt): a checkpoint from someone else is their
        file, and one whose state listed ``/home/me/thesis`` or ``<folder>/../../data`` (which Lightning's own
        check, on the path as written, takes for a file of the folder) had a resume delete that file or folder."""
        folder = os.path.abspath(self.dirpath or "")

        def own(path: Any) -> bool:
            return isinstance(path, str) and path.endswith(self.FILE_EXTENSION) and \
                os.path.dirname(os.path.abspath(path)) == folder

        self.best_k_models = {k: v for k, v in self.best_k_models.items() if own(k)}
        if self.last_model_path and not own(self.last_model_path):
            self.last_model_path = ""
        if self.kth_best_model_path and not own(self.kth_best_model_path):  # the next one removed: Lightning's pick
            self.kth_best_model_path = (max if self.mode == "min" else min)(
                self.best_k_models, key=self.best_k_models.get, default="")
            self.kth_value = self.best_k_models.get(self.kth_best_model_path, self.kth_value)


def moved_state(state: dict[str, Any], was: str, now: str) -> dict[str, Any]:
    """A ModelCheckpoint's state with the paths under folder ``was`` put under ``now``."""
    def move(path: Any) -> Any:
        return now + path[len(was):] if isinstance(path, str) and (path == was or path.startswith(was + os.sep)) \
            else path

    out = {**state, "dirpath": now}
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in out:
            out[key] = move(out[key])
    if isinstance(out.get("best_k_models"), dict):
        out["best_k_models"] = {move(k): v for k, v in out["best_k_models"].items()}
    return out


class BestCheckpoint(_RunFolderCheckpoint):
    """``best.ckpt``: a ModelCheckpoint of tinylm's own, so that its state in a checkpoint is keyed apart from a
    user's ``--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.monitor val/loss`` (Lightning refuses two
    callbacks of one state key: a traceback, "Found more than one stateful callback of type ModelCheckpoint").
    Checkpoints written before it keyed its state as a plain ModelCheckpoint's: a resume of one reads that (Lightning
    looks up ``_legacy_state_key`` when ``state_key`` is missing), so its best score is kept."""

    @property
    def _legacy_state_key(self) -> str:  # type: ignore[override]
        return self.state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self.continues and self.dirpath:
            self._adopt_saved_best(trainer.global_step)

    def _adopt_saved_best(self, step: int) -> None:
        """Take the score of the run's own best.ckpt where it beats the resumed state's. A run's last step saves
        step-N.ckpt and last.ckpt before the validation Lightning adds where a run stops between two scheduled ones
        (`PeriodicCheckpoint`), so their state lacks that validation's score, which best.ckpt (saved after it) has: a
        resume with a larger max_steps replaced best.ckpt by the first later model better than the one before it,
        worse than the one it held. A best.ckpt from past ``step`` (a resume that fell back to an older file) is not
        taken."""
        from tinylm.checkpoint import load_checkpoint

        path = os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)
        if not os.path.isfile(path):  # (none yet; FSDP2's folder of shards keeps the resumed state's score)
            return
        try:
            saved = load_checkpoint(path, mmap=True)
        except (OSError, ValueError):  # a damaged best.ckpt: the resumed state's score stands
            return
        states = saved.get("callbacks") or {}
        score = (states.get(self.state_key) or states.get(self._legacy_state_key) or {}).get("best_model_score")
        if score is None or int(saved.get("global_step", step + 1)) > step:
            return
        score = torch.as_tensor(score)
        if self.best_model_score is None or {"min": torch.lt, "max": torch.gt}[self.mode](score, self.best_model_score):
            self.best_model_path = self.kth_best_model_path = path
            self.best_model_score = self.kth_value = score
            self.best_k_models = {path: score}


def log_step_row_now(trainer: L.Trainer) -> None:
    """Write this step's CSV row now, from a hook that runs before Lightning logs it (after on_train_batch_end): a
    `kill -9` during a save (step-N.ckpt written, last.ckpt not yet) lost the row for good, the resume going on from
    step N + 1; a run the guard stops lost the row of its last step. RunCSVLogger then leaves out Lightning's own
    log of the row."""
    connector = trainer._logger_connector
    if not connector.should_update_logs or not (metrics := connector.metrics["log"]):
        return  # (with nothing to log Lightning writes no row, and RunCSVLogger would skip the step's next one)
    row = {**metrics, "epoch": trainer.current_epoch}  # what Lightning's log_metrics writes
    for logger in trainer.loggers:
        if isinstance(logger, RunCSVLogger):
            logger.log_ahead(row, step=trainer.fit_loop.epoch_loop._batches_that_stepped)


class PeriodicCheckpoint(_RunFolderCheckpoint):
    """``ModelCheckpoint`` every N optimizer steps plus ``last.ckpt``, and always one at the final step, also when
    the run stops early (``--trainer.max_time``, EarlyStopping): there after the optimizer step it is in.

    Lightning saves only on the N-step trigger, so a run whose ``max_steps`` is not a multiple of N would end with a
    ``last.ckpt`` from before its final steps. At a step where validation runs, the save waits for that validation:
    Lightning saves in ``on_train_batch_end``, before it, and a run killed in between resumed past the validation
    (its ``val/*`` row and ``best.ckpt`` candidate were lost). Each save first flushes the loggers (and writes the
    step's own CSV row, which Lightning logs after the save), so after a ``kill -9`` the CSV on disk holds every row
    up to the newest checkpoint's step.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._save_after_validation = False
        self._step_seen = -1
        self._stepped = True  # the last training batch ended an optimizer step
        self._stop_after_step = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step_seen, self._stepped, self._stop_after_step = trainer.global_step, True, False
        if self.continues and self.dirpath and os.path.isdir(self.dirpath):  # (a rank of a node without the folder)
            self._adopt_earlier_files(trainer.global_step)
            self._trim_to_keep(trainer)

    def _adopt_earlier_files(self, step: int) -> None:
        """Count in run.keep_checkpoints the run's step-N.ckpt (N <= ``step``) that the resumed state does not list
        (saved under another run.checkpoint_every, which keys Lightning's state; left by a resume that fell back past
        newer files): they stayed forever beside the kept ones (1.5 GB each at GPT-2's size)."""
        known = {os.path.realpath(p) for p in self.best_k_models}
        for name in sorted(os.listdir(self.dirpath)):
            n, full = name.removeprefix("step-").removesuffix(".ckpt"), os.path.join(self.dirpath, name)
            if name == f"step-{n}.ckpt" and n.isdigit() and int(n) <= step and os.path.realpath(full) not in known:
                self.best_k_models[full] = torch.tensor(float(n))
        if self.best_k_models:  # the one the next save replaces (mode max: the oldest step)
            self.kth_best_model_path = min(self.best_k_models, key=lambda p: float(self.best_k_models[p]))
            self.kth_value = self.best_k_models[self.kth_best_model_path]

    def _hold_stop_to_the_step(self, trainer: L.Trainer) -> None:
        # --trainer.max_time (Lightning's Timer checks after every batch), or EarlyStopping after a validation that
        # ran mid-accumulation, would stop inside a gradient accumulation: the final checkpoint could not be resumed
        # exactly (its batches counted, their gradients lost). The stop waits for the end of the step.
        if trainer.should_stop and not self._stepped:
            trainer.should_stop, self._stop_after_step = False, True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        self._stepped, self._step_seen = trainer.global_step != self._step_seen, trainer.global_step
        if self._stepped and self._stop_after_step:
            trainer.should_stop, self._stop_after_step = True, False
        self._hold_stop_to_the_step(trainer)
        # the run's last step: max_steps, or a stop that went through (max_time, EarlyStopping, held to this step)
        final = 0 < trainer.max_steps <= trainer.global_step or (self._stepped and trainer.should_stop)
        if not self._stepped:
            # inside an optimizer step: Lightning's own test (global_step % N) would save the step before again,
            # mid-accumulation, after a resume from it (its "saved at this step" mark is not restored), overwriting
            # step-N.ckpt and last.ckpt with a file whose accumulated gradients are lost
            return
        # A scheduled validation at this step: the save waits for it (a kill in between lost its row and best.ckpt
        # candidate). The extra validation Lightning runs at a stop between two scheduled ones does not: saved after
        # it, at an epoch's last batch, the checkpoint resumed one batch off (Lightning's loop state then says the
        # epoch's batches are all done but the epoch is not).
        # every N steps, by tinylm's own test: Lightning 2.6 defers a save at an epoch's last batch to the next
        # validation (it expects one at each epoch's end), which here comes steps later (step-25 saved as step-26)
        due = final or (self._every_n_train_steps > 0 and trainer.global_step % self._every_n_train_steps == 0)
        if scheduled_validation_follows(trainer):
            self._save_after_validation = due and not self._should_skip_saving_checkpoint(trainer)
        elif due:
            log_step_row_now(trainer)
            self._save_now(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._hold_stop_to_the_step(trainer)
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._hold_stop_to_the_step(trainer)
        super().on_validation_end(trainer, pl_module)
        stops_here = not trainer.sanity_checking and self._stepped and trainer.should_stop  # EarlyStopping
        if self._save_after_validation or stops_here:
            self._save_after_validation = False
            self._save_now(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A run stopped before max_steps (--trainer.max_time, EarlyStopping) has saved where it stopped, in the hooks
        # above (Lightning's own on_train_end saves last.ckpt only when nothing was saved during the run, so a resume
        # went back to an older checkpoint and cut the logged steps after it). Not here: after the epoch's end, whose
        # loop state resumes one logging step off (Lightning counts the ended epoch's last batch again). This save is
        # for the stops those hooks do not see; it is skipped when the step is saved already.
        self._save_now(trainer)
        if not trainer.fast_dev_run:  # Lightning's own save of last.ckpt forgets fast_dev_run's "save nothing"
            super().on_train_end(trainer, pl_module)

    def _save_now(self, trainer: L.Trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            self._trim_to_keep(trainer)
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def _trim_to_keep(self, trainer: L.Trainer) -> None:
        """Remove the oldest step-N.ckpt beyond save_top_k (run.keep_checkpoints): Lightning removes one per save,
        and only when it holds exactly save_top_k, so a resume with a smaller keep_checkpoints (the run kept
        more, or all) never shrank the folder."""
        if not 0 < self.save_top_k < len(self.best_k_models):
            return
        oldest_first = sorted(self.best_k_models, key=lambda path: float(self.best_k_models[path]))  # monitor: step
        for path in oldest_first[: len(oldest_first) - self.save_top_k]:
            self.best_k_models.pop(path)
            self._remove_checkpoint(trainer, path)
        self.kth_best_model_path = oldest_first[-self.save_top_k]
        self.kth_value = self.best_k_models[self.kth_best_model_path]

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        for logger in trainer.loggers:
            logger.save()
        super()._save_checkpoint(trainer, filepath)


def run_tokenizer(trainer: L.Trainer, pl_module: L.LightningModule):
    """The run's tokenizer: the data module's, else the one the module carries from its checkpoint."""
    tok = getattr(getattr(trainer, "datamodule", None), "tokenizer", None)
    if tok is None and getattr(pl_module, "tokenizer_state", None):
        from tinylm.tokenize.tokenizer import Tokenizer

        tok = Tokenizer.from_state_dict(pl_module.tokenizer_state)
    return tok


from tinylm.train.progress_bar import ProgressBar  # noqa: E402, F401 (its place before: configs name it there)
