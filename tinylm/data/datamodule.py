"""The LightningDataModule: corpus -> tokenizer -> packed memmaps -> (x, y) batches of shape (B, T). The options,
the tokenizer and the datasets are tinylm.data.prepared's (no Lightning there, for `tinylm prepare`); this adds the
loaders, the sampler position that travels in checkpoints, and the checks of a resume's data."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from tinylm.data.hf_corpus import held_out
from tinylm.data.loader import (
    MixedTrainBatches,
    ResumableLoader,
    StoppingLoader,
    TrainBatches,
    ValBatches,
    worker_signals,
)
from tinylm.data.prepared import RANGES, PreparedData

__all__ = ["RANGES", "TinyLMDataModule", "check_global_batch", "global_batch_diff", "other_data", "resplit"]

log = logging.getLogger(__name__)


def other_data(before: str, after: str, fix: str) -> Exception:
    """The error of a resume that would draw other training data than its checkpoint's run."""
    from tinylm.checkpoint import CheckpointError

    return CheckpointError(f"the checkpoint was trained with {before} but this run has {after}, so the resumed run "
                           f"would draw different data; resume with {fix}, or start a new run")


def resplit(saved: dict, batch_size: Any, world_size: int, accumulate: Any) -> tuple[int, int] | None:
    """(windows one micro-batch drew in the checkpoint's run, windows it draws now) when a resume splits the run's
    global batch another way: the same windows an optimizer step (data.batch_size x devices x accumulation) in
    micro-batches of another size, e.g. 2 devices x batch 4 resumed on 1 device x batch 4 x accumulation 2. None
    when the micro-batches keep their size, when the global batch changes (the restore refuses that), and for
    checkpoints from before the accumulation was saved. `saved` is the data module's part of the checkpoint."""
    had = saved.get("accumulate_grad_batches")
    if not all(isinstance(v, int) and v > 0 for v in (saved.get("batch_size"), saved.get("world_size"), had,
                                                      batch_size, world_size, accumulate)):
        return None
    was, now = saved["batch_size"] * saved["world_size"], batch_size * world_size
    return (was, now) if was != now and was * had == now * accumulate else None


def global_batch_diff(saved: dict, batch_size: int, world: int, accumulate: int) -> tuple[str, str, str]:
    """(before, after, fix) for `other_data`: a resume whose windows an optimizer step draws (data.batch_size x
    devices x accumulation) differ from the run's, with the options that keep them on this many devices."""
    n, had = saved["world_size"], saved.get("accumulate_grad_batches")
    if had is None:  # checkpoints from before the accumulation was saved: data.batch_size x devices
        was, now = saved["batch_size"] * n, batch_size * world
        fix = f"--data.batch_size {was // world}" if was % world == 0 else \
            f"--data.batch_size {saved['batch_size']} on {n} device(s)"
        if accumulate > 1:
            fix += (" (the checkpoint is from before tinylm saved the run's accumulation, so accumulation cannot "
                    "stand in for devices or batch size on its resume)")
        return (f"a global batch of {was} windows (data.batch_size={saved['batch_size']} x {n} device(s))",
                f"{now} (data.batch_size={batch_size} x {world})", fix)
    was, now = saved["batch_size"] * n * had, batch_size * world * accumulate
    fixes = []  # the run's own split where this device count allows it, then ones that trade accumulation
    if saved["batch_size"] * n % world == 0:
        fixes.append(f"--data.batch_size {saved['batch_size'] * n // world}"
                     + (f" --trainer.accumulate_grad_batches {had}" if had != accumulate else ""))
    if was % (batch_size * world) == 0 and was // (batch_size * world) not in (accumulate, had):
        fixes.append(f"--trainer.accumulate_grad_batches {was // (batch_size * world)}")
    if was % (world * accumulate) == 0 and was // (world * accumulate) not in (batch_size,
                                                                            saved["batch_size"] * n // world):
        fixes.append(f"--data.batch_size {was // (world * accumulate)}")
    return (f"a global batch of {was} windows a step (data.batch_size={saved['batch_size']} x {n} device(s) x "
            f"accumulation {had})", f"{now} ({batch_size} x {world} x {accumulate})",
            " or ".join(fixes) or f"--data.batch_size {saved['batch_size']} --trainer.accumulate_grad_batches "
                                  f"{had} on {n} device(s)")


def check_global_batch(saved: dict, batch_size: Any, world: int, accumulate: Any) -> None:
    """Refuse, from the data module's part of a checkpoint alone (before the data is prepared, and before the ranks
    start: each would say it), a resume whose micro-batch (data.batch_size x devices) changed and whose global batch
    did not stay the same; the restore refuses it too (`TinyLMDataModule._check_same_data`)."""
    if not all(isinstance(v, int) and v > 0 for v in (saved.get("batch_size"), saved.get("world_size"),
                                                      batch_size, world, accumulate)):
        return
    if saved["batch_size"] * saved["world_size"] != batch_size * world and \
            resplit(saved, batch_size, world, accumulate) is None:
        raise other_data(*global_batch_diff(saved, batch_size, world, accumulate))


class TinyLMDataModule(PreparedData, L.LightningDataModule):
    __doc__ = PreparedData.__doc__  # the options' help in `tinylm fit --help` (jsonargparse reads the class's)
    _train_loader: ResumableLoader | None = None
    _resume_batches = 0
    _resplit: tuple[int, int] | None = None  # (windows a micro-batch drew, draws now) of a resume that re-splits
    _epoch_offset = 0  # where the loader's notional epochs end (`_align_epoch`)

    def record_hyperparameters(self, frame) -> None:
        # `vocab_size` here is the *target* for trained tokenizers; the model logs the real one under the same name
        self.save_hyperparameters(ignore=["vocab_size"], frame=frame)  # as in TinyLM.__init__
        self.hparams["target_vocab_size"] = self.target_vocab_size  # for `tinylm validate` without --config
        self.hparams["clean"] = dataclasses.asdict(self.clean)  # plain values: checkpoints load with weights_only

    def prepare_data(self) -> None:
        super().prepare_data()
        # here as well as in setup: Lightning starts the loggers (a W&B run, csv/) between the two hooks, and a
        # split too short to train on left an empty W&B run behind (setup still checks the ranks that skip this)
        if self.trainer is not None:
            self.check_splits(getattr(self.trainer.state.fn, "value", None))

    def _split(self, i: int, name: str) -> dict:
        meta = self.metas[i]
        return {"path": self.dataset_dirs[i] / f"{name}.bin", "dtype": meta["dtype"],
                "n_tokens": meta["splits"][name]["tokens"], "block_size": self.block_size,
                "batch_size": self.batch_size}

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if stage == "fit":  # a fit starts at the first batch (a resume's load_state_dict, after setup, moves it): a
            # batch peeked at before, or an earlier fit of this data module, had the next fit start where they left off
            self._train_loader, self._resume_batches, self._epoch_offset = None, 0, 0

    def train_dataloader(self) -> ResumableLoader:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        parts = [TrainBatches(**self._split(i, "train"), seed=self.seed, rank=rank, world_size=world)
                 for i in range(len(self.corpora))]
        dataset = parts[0] if len(parts) == 1 else MixedTrainBatches(parts, self.weights or
                                                                      [p.n_tokens for p in parts])
        # a loader made again (--trainer.reload_dataloaders_every_n_epochs) goes on from the last one's position: from
        # the first window again, each epoch would train on the first epoch's windows once more
        start = self._train_loader.batches_yielded if self._train_loader is not None else self._resume_batches
        self._train_loader = ResumableLoader(dataset, epoch_length=self._epoch_length(), start=start,
                                             num_workers=self.num_workers, pin_memory=self._pin_memory(),
                                             seed=self.seed, epoch_offset=self._epoch_offset)
        return self._train_loader

    def _pin_memory(self) -> bool:
        """Whether batches go to the GPU (page-locked host memory copies faster): not for a run on the CPU of a GPU
        machine (--trainer.accelerator cpu), whose pinned batches cost page-locked memory and a CUDA context."""
        device = getattr(getattr(self.trainer, "strategy", None), "root_device", None)
        return device.type == "cuda" if isinstance(device, torch.device) else torch.cuda.is_available()

    def _epoch_length(self) -> int:
        """The micro-batches of a rank's notional epoch: a whole number of optimizer steps. Lightning ends an epoch
        with an optimizer step, so an epoch of batches not a multiple of accumulate_grad_batches stepped on a partial
        accumulation, and validations every N batches (counted over epochs) fell inside steps after it."""
        accumulate = self._accumulation()
        length = max(1, sum(meta["splits"]["train"]["tokens"] for meta in self.metas) //
                     (self.batch_size * self.block_size))
        return max(accumulate, length - length % accumulate)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """One loader, or for a mixture one per corpus (the module logs val/loss/NAME for each); under several ranks
        each evaluates its share of the batches."""
        ranks = {"rank": self.trainer.global_rank, "world_size": self.trainer.world_size} \
            if self.trainer is not None else {}
        loaders = [StoppingLoader(ValBatches(**self._split(i, "val"), limit=self.val_batches, **ranks), batch_size=None,
                              shuffle=False, num_workers=self.num_workers, pin_memory=self._pin_memory(),
                              persistent_workers=self.num_workers > 0,
                              worker_init_fn=worker_signals if self.num_workers else None,
                              # every iteration draws a base seed from `generator`, from the global RNG without
                              # one: validation would shift the training's dropout stream (exact resume)
                              generator=torch.Generator().manual_seed(self.seed)) for i in range(len(self.corpora))]
        return loaders[0] if len(loaders) == 1 else loaders

    # ---- the sampler position travels in checkpoints (restored before train_dataloader() is called); Lightning's
    # loop state holds the same count again (ResumableLoader.state_dict), loaded into the loader after this
    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def _accumulation(self) -> int:
        return getattr(self.trainer, "accumulate_grad_batches", 1) if self.trainer is not None else 1

    @property
    def resumed_batches(self) -> int:
        """The micro-batches (of this run's size) each rank had drawn at the checkpoint a fit resumed; 0 for a fresh
        fit."""
        return self._resume_batches

    def state_dict(self) -> dict:
        done = self._train_loader.batches_yielded if self._train_loader is not None else self._resume_batches
        state = {"train_batches_yielded": done, "batch_size": self.batch_size, "world_size": self._world_size(),
                 "accumulate_grad_batches": self._accumulation(),
                 "seed": self.seed, "block_size": self.block_size, "weights": self.weights,
                 "clean": self.clean.key(), "streaming": self._hf["streaming"],
                 "max_documents": self._hf["max_documents"]}
        if self._metas is not None:  # what the training windows were drawn from: each corpus's text and split
            state.update(corpus_specs=list(self.corpus_specs), corpus_paths=corpus_paths(self.corpus_specs),
                         corpus_fingerprints=[m["corpus_fingerprint"] for m in self._metas],
                         split_settings=[m["settings"] for m in self._metas], val_fraction=self.val_fraction)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        fitting = self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if fitting:  # validating or testing from a checkpoint draws no training data: any batch size will do
            self._check_same_data(state_dict)
        elif self.trainer is not None:
            self._check_held_out(state_dict)
        self._resume_batches = int(state_dict.get("train_batches_yielded", 0))
        if self._train_loader is not None:
            self._train_loader.load_state_dict({"batches_yielded": self._resume_batches})

    def _check_same_data(self, saved: dict) -> None:
        """Refuse a resume that would draw other training data than the checkpoint's run (checkpoints from before
        these keys were saved are not checked). Batch k holds global samples k * B * W ... (k + 1) * B * W - 1, keyed
        by the seed (loader.TrainBatches), so what must match is the seed and the windows of a micro-batch over the
        devices, B x W (or a re-split of the same step's windows: another device count with accumulation standing in
        for it, which `resume_split` counted in the new micro-batches). Another accumulation alone is taken: it
        regroups the same sequence of windows into steps (a larger global batch from the resume on)."""
        from tinylm.checkpoint import CheckpointError

        if "batch_size" not in saved:
            return
        world, n = self._world_size(), saved["world_size"]
        was, now = saved["batch_size"] * n, self.batch_size * world
        diffs = [(f"data.{k}={saved[k]}", f"data.{k}={getattr(self, k)}", f"--data.{k} {saved[k]}")
                 for k in ("seed", "block_size", "weights") if k in saved and not _same(k, saved[k], getattr(self, k))]
        if was != now and self._resplit != (was, now):  # (a re-split of the same global batch: `resume_split`)
            if resplit(saved, self.batch_size, world, self._accumulation()) is not None:  # outside TinyLM's module
                raise CheckpointError(f"the checkpoint's position counts micro-batches of {was} windows and this "
                                      f"run's hold {now}: call resume_split(checkpoint) from the LightningModule's "
                                      f"on_load_checkpoint (as tinylm's does), or resume with --data.batch_size "
                                      f"{saved['batch_size']} on {n} device(s)")
            diffs.insert(0, global_batch_diff(saved, self.batch_size, world, self._accumulation()))
        # what selects the text: named before the split and the fingerprint that they change (a streamed run resumed
        # without streaming was told "val_fraction=0.1 but this run has val_fraction=0.1"; another max_documents,
        # that the files were edited)
        diffs += _stream_diffs(saved, self._hf["streaming"], self._hf["max_documents"], self.val_fraction)
        if saved.get("split_settings") not in (None, [m["settings"] for m in self.metas]):
            diffs.append((f"data.val_fraction={saved['val_fraction']}", f"data.val_fraction={self.val_fraction}",
                          f"--data.val_fraction {saved['val_fraction']}"))
        if "clean" in saved and saved["clean"] != self.clean.key():
            diffs.append(_clean_diff(saved["clean"], self.clean.key()))
        if diffs:
            raise other_data(*diffs[0])
        self.check_same_text(saved)

    def check_same_text(self, saved: dict) -> None:
        """Refuse a resume whose corpus holds other text than the checkpoint's run read (``saved``: the data module's
        state in the checkpoint)."""
        was_fps, now_fps = saved.get("corpus_fingerprints"), [m["corpus_fingerprint"] for m in self.metas]
        if was_fps is not None and was_fps != now_fps and not self._older_keys(was_fps, now_fps):
            raise _other_text(saved, now_fps, self.corpus_specs)

    def _older_keys(self, was_fps: list, now_fps: list) -> bool:
        """Whether each of ``was_fps`` that is not this run's is its corpus's key by an older tinylm (the same
        files: `HFDataset.older_fingerprint`)."""
        if len(was_fps) != len(now_fps) or len(self.corpora) != len(now_fps):
            return False
        return all(was == now or was == getattr(corpus, "older_fingerprint", None)
                   for was, now, corpus in zip(was_fps, now_fps, self.corpora))

    @staticmethod
    def check_text_before_preparing(saved: dict, options: dict) -> None:
        """Refuse a resume whose ``--data.corpus`` (``options``: the data section) holds other text than the
        checkpoint's run read, when both are local text files: the restore refuses it too (`_check_same_data`), but
        only after the data was prepared (a tokenizer trained on the other text, all of it tokenized), and as "a
        different model shape" where its characters made another character vocabulary. The fingerprints are read
        here as preparing the data reads them (cleaning is part of them), of files other than the run's (the run's own
        are hashed once, by preparing the data); hub and named corpora wait for that too. Likewise a stream read
        otherwise (`_stream_diffs`: data.streaming, data.max_documents), which would be read again whole."""
        from tinylm.data.corpus import TextFiles
        from tinylm.data.named import NAMED

        if diffs := _stream_diffs(saved, options.get("streaming", False), options.get("max_documents"),
                                  options.get("val_fraction")):
            raise other_data(*diffs[0])
        corpus, was_fps = options.get("corpus"), saved.get("corpus_fingerprints")
        specs = [corpus] if isinstance(corpus, str) else list(corpus or [])
        if not was_fps or options.get("streaming") or not all(isinstance(s, str) for s in specs) or \
                any(s in NAMED or s.startswith("hf:") for s in specs):
            return
        try:
            data = PreparedData(**options)
        except Exception:  # noqa: BLE001 (the data module says what is wrong with an option, in its own words)
            return
        if "clean" in saved and saved["clean"] != data.clean.key():  # (another cleaning: other fingerprints)
            raise other_data(*_clean_diff(saved["clean"], data.clean.key()))
        if corpus_paths(data.corpus_specs) == saved.get("corpus_paths"):
            return  # the run's own files: preparing the data hashes them once (an edit is refused then)
        try:
            corpora = data.corpora  # (as preparing the data opens and cleans them; nothing read yet)
            if not all(isinstance(getattr(c, "inner", c), TextFiles) for c in corpora):
                return  # (a dataset file: its fingerprint loads it)
            now_fps = [c.fingerprint for c in corpora]
        except Exception:  # noqa: BLE001 (preparing the data says what is wrong with it, in its own words)
            return
        if now_fps != was_fps:
            raise _other_text(saved, now_fps, data.corpus_specs)


    def resume_split(self, checkpoint: dict) -> None:
        """Count a resumed run's position in this run's micro-batches when they are not the checkpoint's: the loader's
        position when a micro-batch draws another number of windows (`resplit`: accumulation standing in for devices
        or batch size), and Lightning's batch counters, which decide where an accumulation ends in a step and where
        validation runs, whenever a step takes another number of micro-batches (a changed accumulate_grad_batches
        too: counted as if the run had always stepped so, a validation interval keeps to whole steps). The module
        calls this from its `on_load_checkpoint` when fitting: `load_state_dict` is handed only this module's part of
        the checkpoint, and Lightning restores its loops from the rest after both. Then `_align_epoch`."""
        self._drop_unrun_batch(checkpoint)
        self._count_again(checkpoint)
        self._align_epoch(checkpoint)

    def _drop_unrun_batch(self, checkpoint: dict) -> None:
        """A checkpoint saved after a batch was drawn and before it trained (Lightning's OnExceptionCheckpoint, at a
        failure in on_train_batch_start or training_step) counts that batch as drawn and ready: the resume skipped its
        windows and, its schedule counting ready batches, validated one batch early from there on. Both are set back
        to the batches that trained, so the resume trains that batch (as the uninterrupted run did)."""
        saved = checkpoint.get(type(self).__qualname__) or {}
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        progress = fit_loop.get("epoch_loop.batch_progress") or {}
        total = progress.get("total") or {}
        unrun = int(total["ready"]) - int(total["processed"]) if {"ready", "processed"} <= set(total) else 0
        if unrun <= 0:
            return
        for counts in (progress.get("total"), progress.get("current")):
            if counts and "processed" in counts:
                counts["ready"] = counts["started"] = counts["processed"]
        progress["is_last_batch"] = False  # (the batch drawn may have been its epoch's last: it is to come)
        if "train_batches_yielded" in saved:
            saved["train_batches_yielded"] = int(saved["train_batches_yielded"]) - unrun
        for state in (fit_loop.get("state_dict") or {}).get("combined_loader") or []:
            if isinstance(state, dict) and "batches_yielded" in state:  # the loader's own count (ResumableLoader)
                state["batches_yielded"] = int(state["batches_yielded"]) - unrun

    def _align_epoch(self, checkpoint: dict) -> None:
        """Have the loader's notional epoch end where Lightning's restored loop counts its epoch to end. Lightning ends
        an epoch where its count of the epoch's micro-batches reaches len(loader), and steps there on what the
        accumulation holds; the loader ends one at a multiple of its length from the run's first micro-batch. That
        length is a rank's micro-batches (another device count or accumulation: another length), so a resume that
        changed it had the two disagree: 2 ranks x batch 4 resumed past half an epoch on 1 x 4 x accumulation 2 took
        its first step on one micro-batch (divided by 2), and micro-batches drawn at the loader's epoch end had their
        gradient dropped by the next epoch's first step. The loop's count is taken within the new epoch, and the
        loader's epochs end where that count does."""
        saved = checkpoint.get(type(self).__qualname__) or {}
        progress = ((checkpoint.get("loops") or {}).get("fit_loop") or {}).get("epoch_loop.batch_progress") or {}
        counts = progress.get("current") or {}
        if "train_batches_yielded" not in saved or "processed" not in counts:
            return  # (not a Lightning training checkpoint of this data module: restoring it says so)
        length, position = self._epoch_length(), int(saved["train_batches_yielded"])
        if progress.get("is_last_batch"):  # the loop starts the next epoch, counting from 0
            self._epoch_offset = position % length
            return
        # whole epochs of this run's length off every count (`completed` may be one less: the loop adds it, and at
        # the epoch's length starts the next one); the loop goes on from `processed`
        cut = min(int(v) for v in counts.values()) // length * length
        for key, value in counts.items():
            counts[key] = int(value) - cut
        self._epoch_offset = (position - counts["processed"]) % length

    def _count_again(self, checkpoint: dict) -> None:
        """`resume_split`'s count of the position and of Lightning's counters in this run's micro-batches."""
        from tinylm.checkpoint import CheckpointError

        saved = checkpoint.get(type(self).__qualname__) or {}
        had, accumulate = saved.get("accumulate_grad_batches"), self._accumulation()
        sizes = resplit(saved, self.batch_size, self._world_size(), accumulate)  # (None unless `had` is a count)
        same_size = saved.get("batch_size", 0) * saved.get("world_size", 0) == self.batch_size * self._world_size()
        if sizes is None and not (same_size and isinstance(had, int) and 0 < had != accumulate):
            return  # nothing to count again (or a changed global batch, which the restore refuses)

        def scaled(n: int, was: int, now: int, what: str) -> int:
            if n * was % now:  # not at the end of an optimizer step (every checkpoint of a run is, but an edit)
                raise CheckpointError(f"the checkpoint's {what}, {n}, is not a whole number of this run's micro-"
                                      f"batches; resume with --data.batch_size {saved['batch_size']} "
                                      f"--trainer.accumulate_grad_batches {had} on {saved['world_size']} device(s)")
            return n * was // now

        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        progress = fit_loop.get("epoch_loop.batch_progress") or {}
        for counts in (progress.get("total"), progress.get("current")):
            if counts and "processed" in counts:  # each keeps its distance from `processed` (completed may be 1 less)
                done = int(counts["processed"])
                for key, value in counts.items():
                    counts[key] = scaled(done, accumulate, had, "micro-batch count") - (done - int(value))
        if sizes is None:
            return
        was, now = sizes
        saved["train_batches_yielded"] = scaled(int(saved.get("train_batches_yielded", 0)), was, now, "position")
        for state in (fit_loop.get("state_dict") or {}).get("combined_loader") or []:
            if isinstance(state, dict) and "batches_yielded" in state:  # the loader's own count (ResumableLoader)
                state["batches_yielded"] = scaled(int(state["batches_yielded"]), was, now, "position")
        self._resplit = sizes
        log.info("resuming data.batch_size=%d x %d device(s) x accumulation %d as %d x %d x %d: the same %d windows "
                 "a step, %d micro-batches of them so far", saved["batch_size"], saved["world_size"], had,
                 self.batch_size, self._world_size(), accumulate, was * had, saved["train_batches_yielded"])

    def _check_held_out(self, saved: dict) -> None:
        """Name an evaluation whose validation split may hold text the checkpoint trained on: a val_fraction larger
        than the run's (the split is the corpus's tail, so it reaches back into the run's training text), or the
        run's own corpus holding other text now."""
        was_fps, now_fps = saved.get("corpus_fingerprints"), [m["corpus_fingerprint"] for m in self.metas]
        if was_fps is None or self._other_head(saved):
            return
        if was_fps != now_fps and not self._older_keys(was_fps, now_fps):  # another corpus, evaluated as such; or
            # the run's own, edited since
            if saved.get("corpus_specs") == list(self.corpus_specs):
                log.warning("data.corpus %s holds other text than when the checkpoint trained on it (its fingerprint "
                            "changed: the files were edited or replaced): the validation split may hold text the "
                            "model trained on", self.corpus_spec)
            return
        tail = any((s or {}).get("val_source") == "tail" for s in saved.get("split_settings") or [])
        was = saved.get("val_fraction")
        if tail and was is not None and self.val_fraction > was:
            log.warning("data.val_fraction %s is larger than the %s the checkpoint trained with: the split is the "
                        "corpus's tail, so %.0f%% of it is text the model trained on and val/loss comes out low; "
                        "pass --data.val_fraction %s or smaller", self.val_fraction, was,
                        100 * (self.val_fraction - was) / self.val_fraction, was)

    def _other_head(self, saved: dict) -> bool:
        """Whether the run's own stream is evaluated on its first documents counted otherwise (val_fraction x
        max_documents, either changed), said where a held-out head grew into the documents the run trained on: the
        stream's fingerprint changes with them, which was said to be the files edited (for the same count, or a
        dataset's own split read otherwise, too)."""
        was_n, n, was_fraction = saved.get("max_documents"), self._hf["max_documents"], saved.get("val_fraction")
        if not (saved.get("streaming") and self._hf["streaming"] and was_n and n and was_fraction is not None) or \
                (was_n, was_fraction) == (n, self.val_fraction):
            return False
        was, now = held_out(was_fraction, was_n), held_out(self.val_fraction, n)
        grown = min(now, was + was_n) - was  # of the documents the run trained on, after its own head
        if grown > 0 and any(m["settings"]["val_source"] == "held-out head" for m in self.metas):
            log.warning("validation holds out the stream's first %d documents (data.val_fraction %s x data."
                        "max_documents %d), the checkpoint's run its first %d, and trained on those after them, so %d "
                        "of them are text the model trained on and val/loss comes out low; pass --data.val_fraction "
                        "%s --data.max_documents %d", now, self.val_fraction, n, was, grown, was_fraction, was_n)
        return True

    @staticmethod
    def check_split_before_preparing(saved: dict, val_fraction: float) -> None:
        """Refuse a resume with another val_fraction from the checkpoint's datamodule state alone: the restore
        refuses it too (`_check_same_data`), but only after the data was prepared, which builds a new dataset for
        nothing (the split settings are part of a dataset's key; a stream's held-out documents, of its fingerprint:
        the whole stream was read again)."""
        if diffs := _stream_diffs(saved, saved.get("streaming"), saved.get("max_documents"), val_fraction):
            raise other_data(*diffs[0])
        cut_by_fraction = any((s or {}).get("val_source") == "tail" for s in saved.get("split_settings") or [])
        if cut_by_fraction and saved.get("val_fraction") != val_fraction:
            raise other_data(f"data.val_fraction={saved['val_fraction']}", f"data.val_fraction={val_fraction}",
                             f"--data.val_fraction {saved['val_fraction']}")


def _other_text(saved: dict, now_fps: list, now_specs: list[str]) -> Exception:
    """The error of a resume whose corpus holds other text than the checkpoint's: another file (by where it is:
    `c.txt` and `$PWD/c.txt` are one file), another number of corpora, or the same file edited since."""
    from tinylm.checkpoint import CheckpointError

    was_fps = saved["corpus_fingerprints"]
    specs = saved.get("corpus_specs") or []
    if len(was_fps) == len(now_fps) == len(specs) and sorted(was_fps) == sorted(now_fps):  # (each text the run's own)
        return CheckpointError(f"the checkpoint's run listed its corpora in another order ({', '.join(specs)}; this "
                               f"run {', '.join(now_specs)}), so the resumed run would draw different data (a window's "
                               f"corpus is picked by its place in the list); resume with --data.corpus "
                               f"[{','.join(specs)}] and its data.weights in that order, or start a new run")
    at = next((i for i, (a, b) in enumerate(zip(was_fps, now_fps)) if a != b), min(len(was_fps), len(now_fps)))
    changed = now_specs[at] if at < len(now_specs) else " + ".join(now_specs)
    paths = saved.get("corpus_paths") or []
    was_spec = specs[at] if at < len(specs) else None
    was_path = paths[at] if at < len(paths) else None
    if len(was_fps) != len(now_fps):
        why = f"the run read {len(was_fps)} corpora, this run {len(now_fps)}"
    elif was_spec is None or (was_path or was_spec) == (corpus_paths([changed])[0] if was_path else changed):
        why = "its fingerprint changed: the files were edited or replaced"
    else:  # (the same spec of another folder: where the run read it)
        why = f"the run read {was_spec!r}" + (f" at {was_path}" if was_spec == changed and was_path else "")
    return CheckpointError(f"the checkpoint was trained on other text than data.corpus {changed!r} holds now ({why}), "
                           "so the resumed run would draw different data; resume with the text it was trained on, or "
                           "start a new run from its weights (--model.init_from CHECKPOINT)")


def _stream_diffs(saved: dict, streaming: Any, max_documents: Any, val_fraction: Any) -> list[tuple[str, str, str]]:
    """(before, after, fix) for `other_data` of each option that reads a stream otherwise than the checkpoint's run
    (``saved``: the data module's part of it): data.streaming, data.max_documents, and data.val_fraction where it
    sized the stream's validation (its first val_fraction x max_documents documents: `HFStream.val_documents`; the
    corpus's fingerprint changes with them, and another one was said to be "the files were edited or replaced")."""
    now = {"streaming": streaming, "max_documents": max_documents}
    diffs = [(f"data.{k}={saved[k]}", f"data.{k}={now[k]}", f"--data.{k} {json.dumps(saved[k])}")
             for k in now if k in saved and saved[k] != now[k]]
    n, was = saved.get("max_documents"), saved.get("val_fraction")
    if not diffs and saved.get("streaming") and n and was is not None and val_fraction is not None and \
            held_out(was, n) != held_out(val_fraction, n):
        diffs.append((f"data.val_fraction={was}", f"data.val_fraction={val_fraction}", f"--data.val_fraction {was}"))
    return diffs


def corpus_paths(specs: list[str]) -> list[str | None]:
    """Where each local corpus of ``specs`` lies, as an absolute path (None for a named or hub corpus, or a glob):
    the file a run read, which a resume from another folder finds by it (tinylm.cli.resume.run_data)."""
    from tinylm.data.named import NAMED

    return [None if spec in NAMED or spec.startswith("hf:") or any(c in spec for c in "*?[")
            else os.path.abspath(os.path.expanduser(spec)) for spec in specs]


def _same(key: str, was: Any, now: Any) -> bool:
    """Whether a saved data setting draws the same training windows as the current one: weights are shares
    (normalised), so [7, 3] is [0.7, 0.3]."""
    if key != "weights" or was is None or now is None or len(was) != len(now):
        return was == now
    return all(math.isclose(a / sum(was), b / sum(now), rel_tol=1e-12) for a, b in zip(was, now))


def _clean_diff(was: dict, now: dict) -> tuple[str, str, str]:
    """(before, after, fix) for `other_data`: the first data.clean option that differs between two `key()`s (an
    option missing from one is off there, or unused)."""
    name = next(k for k in sorted({*was, *now}) if was.get(k) != now.get(k))
    shown = lambda key: f"data.clean.{name}={key[name]}" if name in key else f"data.clean.{name} off"
    fix = f"--data.clean.{name} {json.dumps(was[name])}" if name in was else f"data.clean.{name} at its default"
    return shown(was), shown(now), fix
