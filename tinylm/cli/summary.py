"""What a command says when it is done: a run's summary (steps, tokens, time, final and best validation, where its
files are) and the next commands, with this run's own paths, ready to paste."""

from __future__ import annotations

import contextlib
import csv
import os
import shlex
from pathlib import Path

from tinylm.paths import is_utf8


def shown(path: Path | str) -> str:
    """A path as a user types it: relative to the working directory when it is below it, quoted for a shell."""
    path = Path(path)
    try:
        path = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    if not is_utf8(path):  # a name in bytes that are not UTF-8 (`caf\xe9.ckpt`): bash's $'...' of its bytes
        # (it printed caf\ufffd.ckpt, a name that a pasted command did not find)
        with contextlib.suppress(UnicodeEncodeError):  # (a lone surrogate, which no bytes gave: as it is)
            return "$'" + "".join(chr(b) if 32 <= b < 127 and b not in b"\\'" else f"\\x{b:02x}"
                                  for b in os.fsencode(path)) + "'"
    return shlex.quote(str(path))


def example_prompt(tokenizer) -> str:
    """A prompt for the next `tinylm generate` that the run's tokenizer encodes: 'ROMEO:', else the empty prompt
    (the end-of-text token, or a newline), else the vocabulary's first character (a char tokenizer of a corpus
    without those: 'ROMEO:' ended the pasted command in an error)."""
    from tinylm.generate.prompts import default_prompt

    for prompt in ("ROMEO:", ""):
        try:
            if prompt:
                tokenizer.encode(prompt)
            else:
                default_prompt(tokenizer)
            return prompt
        except ValueError:
            continue
    # escaped as generate reads escapes (\t, \n, \r, \\): unicode_escape's \u3053 of a CJK corpus's character was
    # read as its six characters, and the pasted command failed ("character '\\' is not in the vocabulary")
    return "".join({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c, c) for c in tokenizer.decode([0]))


def next_commands(ckpt: Path, run_dir: Path, prompt: str = "ROMEO:", exportable: bool = True) -> list[str]:
    """generate, validate, plot (when the run logged metrics: not with --trainer.logger false) and export (when
    transformers can represent the model: `tinylm.hf.hf_family`) for a checkpoint of the run in ``run_dir``."""
    c, r = shown(ckpt), shown(run_dir)
    plot = [f"tinylm plot {r}"] if (run_dir / "csv" / "metrics.csv").is_file() else []
    export = [f"tinylm export --ckpt_path {c} --out {shown(run_dir / 'hf')}"] if exportable else []
    return [f"tinylm generate --ckpt_path {c} --prompt {shlex.quote(prompt)}",
            f"tinylm validate --ckpt_path {c}",
            *plot,
            *export]


def _val_rows(metrics: Path) -> list[dict]:
    if not metrics.is_file():
        return []
    with open(metrics, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r.get("val/loss")]


def count(n: int, thing: str) -> str:
    """``1 step``, ``3 steps``."""
    return f"{n:,} {thing}{'s' * (n != 1)}"


def duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{seconds:.1f}s"


def fit_summary(run_dir: Path, *, steps: int, first_step: int, tokens_per_step: int | None, seconds: float,
                prompt: str = "ROMEO:", exportable: bool = True, wandb: tuple[Path, str] | None = None,
                final: dict | None = None, best_loss: float | None = None, checkpointing: bool = True) -> str:
    """The end of a `tinylm fit`: steps and tokens of this command, its wall time, the final and best val/loss and
    val/bpb (from the run's CSV; without one, ``final`` and ``best_loss``: what the trainer holds), where best.ckpt
    and the metrics are, and the next commands. ``wandb``: the folder holding the W&B run's wandb/ folder, and its
    id. ``checkpointing``: whether this command saved checkpoints (off: the run's files are from before it)."""
    done = steps - first_step
    tokens = f", {tokens_per_step * done:,} tokens" if tokens_per_step else ""
    since = f" (from step {first_step:,})" if first_step else ""
    what = f"{count(done, 'step')}{since}{tokens}" if done or not first_step else "its final validation, no step"
    lines = [f"run {run_dir.name} done: step {steps:,}: {what} in {duration(seconds)}"]
    metrics = run_dir / "csv" / "metrics.csv"
    rows = _val_rows(metrics)
    if rows:
        final, best = rows[-1], min(rows, key=lambda r: float(r["val/loss"]))
        at = int(float(final["step"])) + 1
        # (a validation schedule that missed the run's end: its last is not the end's)
        last = "final" if at == steps else f"last (step {at:,})"
        for key in ("val/loss", "val/bpb"):
            if final.get(key):
                lines.append(f"  {key:<8} {last} {float(final[key]):.4f}   best {float(best[key]):.4f} "
                             f"(step {int(float(best['step'])) + 1:,})")
    elif final:  # no metrics.csv (--trainer.logger false): this command's last validation
        for key in ("val/loss", "val/bpb"):
            if key in final:
                kept = f"   best {best_loss:.4f} (best.ckpt)" if key == "val/loss" and best_loss is not None else ""
                lines.append(f"  {key:<8} final {final[key]:.4f}{kept}")
    ckpts = run_dir / "checkpoints"
    best_ckpt, last_ckpt = ckpts / "best.ckpt", ckpts / "last.ckpt"
    saved = [shown(p) for p in (best_ckpt, last_ckpt) if p.exists()]  # (FSDP2: a folder of shards)
    # a resume with --trainer.enable_checkpointing false: the files are the run's from before this command
    # (none due: a resume at the run's end that ran only its final validation, tinylm.train.final_validation). Not
    # told by last.ckpt's mtime against the wall clock: a clock stepped, or a file server's clock minutes behind this
    # machine's, said it of the checkpoints a run had just saved; one saved within a second of the resume was not
    older = not checkpointing and steps > first_step and last_ckpt.exists()
    if saved:
        lines.append(f"  checkpoints: {', '.join(saved)}" + (" (saved before this command, which saved none: "
                                                             "checkpointing was off)" if older else ""))
    if metrics.is_file():
        lines.append(f"  metrics:     {shown(metrics)}")
    from tinylm.train.loggers import WANDB_UNFINISHED, offline_wandb_run

    if wandb and (offline := offline_wandb_run(*wandb)) is not None:  # (this run's W&B run, when it had one)
        # (the parts of a resumed run: a pattern the shell expands, oldest first)
        where = f"{shown(offline.parent)}/{offline.name}" if "*" in offline.name else shown(offline)
        lines.append(f"  W&B:         offline; upload with `wandb sync {where}`" if not WANDB_UNFINISHED else
                     f"  W&B:         offline, {WANDB_UNFINISHED[0]}: {where} may be cut short")
    ckpt = best_ckpt if best_ckpt.exists() else last_ckpt if last_ckpt.exists() else None
    if ckpt is not None:
        lines.append("next:")
        lines += [f"  {c}" for c in next_commands(ckpt, run_dir, prompt, exportable)]
    return "\n".join(lines)


def validate_next(ckpt: Path, prompt: str = "ROMEO:", exportable: bool = True) -> str:
    """After `tinylm validate`: what else to do with that checkpoint."""
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return "next:\n" + "\n".join(f"  {c}" for c in next_commands(ckpt, run_dir, prompt, exportable)
                                  if not c.startswith("tinylm validate "))  # (a path may hold " validate ")


def exportable(model) -> bool:
    """Whether `tinylm export` can write this TinyLM's model (its options are ones transformers has)."""
    from tinylm.hf import hf_family

    try:
        hf_family(model.model.config)
    except ValueError:
        return False
    return True
