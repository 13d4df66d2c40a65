"""W&B without credentials runs offline (never prompts, never blocks), and a resume continues the same W&B run."""

import logging

import pytest

from tinylm.cli import main
from tinylm.train.loggers import make_loggers, wandb_mode


@pytest.fixture
def no_wandb_account(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # conftest disables W&B; these tests want the real decision
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc with a stored key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))


def test_no_credentials_means_offline(no_wandb_account, tmp_path, caplog):
    """Catches W&B prompting for a key (hanging a headless run) or failing when there is no account."""
    assert wandb_mode() == "offline"
    with caplog.at_level(logging.INFO, logger="tinylm"):
        loggers = make_loggers(tmp_path / "run", "r", "tinylm-test")
    kinds = [type(lg).__name__ for lg in loggers]
    assert kinds == ["WandbLogger", "RunCSVLogger"]
    offline_lines = [r.getMessage() for r in caplog.records if "offline" in r.getMessage()]
    assert len(offline_lines) == 1 and "wandb sync" in offline_lines[0]


def test_disabled_or_no_project_means_csv_only(tmp_path, monkeypatch):
    """Catches W&B starting although the user turned it off."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert [type(lg).__name__ for lg in make_loggers(tmp_path, "r", "p")] == ["RunCSVLogger"]
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert [type(lg).__name__ for lg in make_loggers(tmp_path, "r", None)] == ["RunCSVLogger"]


def test_resumed_run_continues_the_same_wandb_run(no_wandb_account, tmp_path, run_config, capfd):
    """Catches a resume opening a second W&B run, splitting one training curve in two; and wandb's deprecation
    warning about the `anonymous` setting Lightning passes (W&B offline was to say one line, not six)."""
    run_config(
        name="c.yaml",
        run={"name": "wb", "wandb_project": "tinylm-test", "checkpoint_every": 2, "keep_checkpoints": -1},
        samples={"every_n_steps": 2, "prompts": ["A"], "max_new_tokens": 4},
        model={"n_layer": 1, "decay_steps": 4},
    )
    main(["fit", "--config", "c.yaml"])
    main(["fit", "--config", "c.yaml", "--trainer.max_steps", "4", "--ckpt_path", "last"])
    err = capfd.readouterr().err
    assert "wandb" in err and "anonymous" not in err  # guard: wandb did talk
    import torch

    first_id = torch.load(tmp_path / "runs" / "wb" / "checkpoints" / "step-2.ckpt", weights_only=True)["tinylm"]["wandb_id"]
    last_id = torch.load(tmp_path / "runs" / "wb" / "checkpoints" / "last.ckpt", weights_only=True)["tinylm"]["wandb_id"]
    runs = sorted((tmp_path / "runs" / "wb" / "wandb").glob("offline-run-*"))
    assert first_id and last_id == first_id  # the resumed process logged into the run the checkpoint named
    assert runs and {r.name.rsplit("-", 1)[1] for r in runs} == {first_id}  # one W&B run on disk
