"""Exact resume: an interrupted and resumed run reproduces the uninterrupted run step for step."""

import csv
from pathlib import Path

import pytest
import yaml

from tinylm.cli import main

STEPS = 8


@pytest.fixture
def config(tmp_path, shared_data, monkeypatch):
    corpus = tmp_path / "shakespeare_small.txt"
    corpus.write_text((shared_data / "tinyshakespeare.txt").read_text()[:40_000])
    cfg = {
        "seed_everything": 3,
        "run": {"name": "straight", "checkpoint_every": 2, "keep_checkpoints": -1, "wandb_project": None},
        "trainer": {
            "max_steps": STEPS,
            "accumulate_grad_batches": 2,
            "val_check_interval": 6,  # batches: validation after optimizer steps 3 and 6
            "log_every_n_steps": 1,
            "precision": "32-true",
            "enable_model_summary": False,
            "enable_progress_bar": False,
            "num_sanity_val_steps": 0,
        },
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0.1, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 2, "decay_steps": STEPS, "pad_vocab_multiple": 1},
        "data": {"corpus": str(corpus), "tokenizer": "char", "block_size": 32, "batch_size": 4, "val_batches": 2,
                 "num_workers": 2, "cache_dir": str(tmp_path / "cache")},
    }
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    return path


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
