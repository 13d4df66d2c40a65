"""Checkpoints that hold the same bytes (last.ckpt and step-N.ckpt of the run's last step) are one file on disk, and
overwriting or removing one name never changes the other."""

import hashlib

import torch

from tinylm.cli import main


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_identical_checkpoints_are_one_file_and_stay_apart_when_one_changes(run_config, tmp_path):
    """Catches last.ckpt and step-N.ckpt written as two full copies of the same bytes (a 5-step GPU-recipe run kept
    371 MB in three copies), and a link that a later save writes through (a resume's new last.ckpt changing the
    kept step-5.ckpt, or trimming step-5.ckpt taking last.ckpt with it)."""
    config = run_config(run={"checkpoint_every": 2, "keep_checkpoints": 1},
                        trainer={"max_steps": 5, "val_check_interval": 2})
    main(["fit", "--config", str(config)])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    last, step5 = ckpts / "last.ckpt", ckpts / "step-5.ckpt"
    assert last.read_bytes() == step5.read_bytes()
    assert last.stat().st_ino == step5.stat().st_ino and last.stat().st_nlink == 2
    kept = _digest(step5)
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6",
          "--run.keep_checkpoints", "2"])
    assert _digest(step5) == kept and torch.load(step5, weights_only=True)["global_step"] == 5
    assert torch.load(last, weights_only=True)["global_step"] == 6
    assert last.stat().st_ino == (ckpts / "step-6.ckpt").stat().st_ino and step5.stat().st_nlink == 1
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8"])  # keeps 1: trims
    assert not (ckpts / "step-6.ckpt").exists() and torch.load(last, weights_only=True)["global_step"] == 8
    assert not list(ckpts.glob("*.tmp"))
