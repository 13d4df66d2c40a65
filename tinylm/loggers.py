"""Loggers: a CSV file always (readable without any account), W&B as the primary dashboard when available.

W&B never blocks a run: with no credentials (or ``WANDB_MODE=offline``) it logs offline into the run folder and
says so in one line; ``WANDB_MODE=disabled`` or ``run.wandb_project: null`` turns it off.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger

log = logging.getLogger("tinylm")


def wandb_mode() -> str:
    """``online``, ``offline`` or ``disabled``: what W&B can do here, decided without waiting on the network."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("disabled", "offline"):
        return mode
    if mode == "dryrun":
        return "offline"
    try:
        import wandb
    except ImportError:
        return "disabled"
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:  # returns False at once when no key is stored; never prompts
        return "online" if wandb.login(prompt=False, verify=False) else "offline"
    except Exception:
        return "offline"


def make_loggers(run_dir: str | Path, name: str, wandb_project: str | None, *, wandb_id: str | None = None) -> list[Logger]:
    """CSV logger (``<run_dir>/csv/metrics.csv``) plus a W&B logger when a project is set and W&B is usable."""
    run_dir = Path(run_dir)
    loggers: list[Logger] = [CSVLogger(save_dir=str(run_dir), name="csv", version="")]
    if wandb_project is None:
        return loggers
    mode = wandb_mode()
    if mode == "disabled":
        log.info("W&B disabled (WANDB_MODE=disabled or wandb not installed); metrics go to %s", run_dir / "csv")
        return loggers
    from lightning.pytorch.loggers import WandbLogger

    if mode == "offline":
        log.info("W&B: no credentials or network; logging offline to %s (upload later with `wandb sync`)", run_dir / "wandb")
    run_dir.mkdir(parents=True, exist_ok=True)
    loggers.insert(
        0,
        WandbLogger(project=wandb_project, name=name, save_dir=str(run_dir), offline=mode == "offline", id=wandb_id, resume="allow"),
    )
    return loggers
