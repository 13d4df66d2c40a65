"""Host-device synchronisations per training step of a real `tinylm fit` run on a GPU, and where they come from.

A callback for the CLI: it turns on `torch.cuda.set_sync_debug_mode("warn")` from batch FIRST to batch LAST, catches
each "called a synchronizing CUDA operation" warning with the Python stack that caused it, and at the end of
training prints syncs per step (logging steps apart from the others) and the code lines they came from. Run:

    PYTHONPATH=benchmarks/gpu tinylm fit --config configs/shakespeare-char.yaml --trainer.callbacks+=syncs.SyncCount

Settings by environment (the CLI passes no arguments to it): SYNCS_FIRST (default 20), SYNCS_LAST (default 59),
SYNCS_JSON (a file for the results).
"""

from __future__ import annotations

import collections
import json
import os
import traceback
import warnings
from pathlib import Path

import lightning as L
import torch

_SKIP = ("/warnings.py", "/syncs.py", "/torch/_tensor.py", "/torch/overrides.py")


class SyncCount(L.Callback):
    def __init__(self) -> None:
        self.first = int(os.environ.get("SYNCS_FIRST", "20"))
        self.last = int(os.environ.get("SYNCS_LAST", "59"))
        self.per_step: dict[int, list] = {}  # batch -> [syncs, logging step?]
        self.where: collections.Counter[str] = collections.Counter()
        self._step: int | None = None
        self._show = None

    def _record(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "called a synchronizing CUDA operation" not in str(message) or self._step is None:
            return self._show(message, category, filename, lineno, file, line)
        self.per_step[self._step][0] += 1
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith(_SKIP)]
        ours = [f for f in frames if "/tinylm/" in f.filename or "/lightning/" in f.filename] or frames
        self.where[" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-3:]))] += 1
        return None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if self.first <= batch_idx <= self.last:
            if self._show is None:
                self._show, warnings.showwarning = warnings.showwarning, self._record
                warnings.simplefilter("always")
                if torch.cuda.is_available():
                    torch.cuda.set_sync_debug_mode("warn")
            self._step = batch_idx
            self.per_step[batch_idx] = [0, bool(trainer._logger_connector.should_update_logs)]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx >= self.last and self._show is not None:
            self._stop()

    def _stop(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning, self._show, self._step = self._show, None, None

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        if self._show is not None:
            self._stop()
        logging = [n for n, is_log in self.per_step.values() if is_log]
        quiet = [n for n, is_log in self.per_step.values() if not is_log]
        summary = {
            "steps": len(self.per_step),
            "logging_steps": len(logging), "syncs_per_logging_step": sum(logging) / max(len(logging), 1),
            "other_steps": len(quiet), "syncs_per_other_step": sum(quiet) / max(len(quiet), 1),
            "where": dict(self.where.most_common()),
        }
        print(f"\nhost syncs: {summary['syncs_per_other_step']:.2f} per step that logs nothing "
              f"({len(quiet)} steps), {summary['syncs_per_logging_step']:.2f} per logging step ({len(logging)} steps)")
        for where, n in self.where.most_common():
            print(f"  {n:4d}  {where}")
        if os.environ.get("SYNCS_JSON"):
            Path(os.environ["SYNCS_JSON"]).write_text(json.dumps(summary, indent=1))
