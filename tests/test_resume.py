"""Exact resume: an interrupted and resumed run reproduces the uninterrupted run step for step."""

import csv
from pathlib import Path

import pytest

from tinylm.cli import main

STEPS = 8


@pytest.fixture
def config(run_config):
    """Everything exact resume must survive: dropout, accumulation, loader workers, validation in between."""
    return run_config(
        chars=40_000,
        seed_everything=3,
        run={"name": "straight", "checkpoint_every": 2, "keep_checkpoints": -1},
        trainer={"max_steps": STEPS, "accumulate_grad_batches": 2, "val_check_interval": 6},  # val after steps 3, 6
        model={"dropout": 0.1, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "decay_steps": STEPS},
        data={"block_size": 32, "batch_size": 4, "val_batches": 2, "num_workers": 2},
    )


def _losses(run_dir: Path) -> dict[int, list[float]]:
    """train/loss rows by logged step (several rows per step under accumulation), in order."""
    out: dict[int, list[float]] = {}
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("train/loss"):
                out.setdefault(int(row["step"]), []).append(float(row["train/loss"]))
    return out


@pytest.mark.parametrize("resume_from", ["last", "step-2.ckpt"])
def test_resumed_run_matches_uninterrupted_run(config, tmp_path, resume_from):
    """Catches non-exact resume: replayed or skipped batches, fresh RNG (dropout), lost optimizer/scheduler state."""
    main(["fit", "--config", str(config)])
    straight = _losses(tmp_path / "runs" / "straight")
    assert sorted(straight) == list(range(STEPS))

    # interrupted at step 4 (same schedule length), then resumed to the end in the same run folder
    main(["fit", "--config", str(config), "--run.name", "resumed", "--trainer.max_steps", "4"])
    run = tmp_path / "runs" / "resumed"
    ckpt = "last" if resume_from == "last" else str(run / "checkpoints" / resume_from)
    start = 4 if resume_from == "last" else 2
    main(["fit", "--config", str(config), "--run.name", "resumed", "--ckpt_path", ckpt])
    resumed = _losses(run)

    assert sorted(resumed) == list(range(STEPS))  # one CSV, continued, no duplicated steps
    for step in range(STEPS):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-4), f"step {step} (resumed from {start})"
    assert straight[STEPS - 1] != straight[0]  # not vacuous: the losses do change
