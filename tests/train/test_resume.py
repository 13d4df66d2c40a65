"""Exact resume: an interrupted and resumed run reproduces the uninterrupted run step for step."""

import csv
import re
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers import _assert_same_rows, _losses, _val_losses

from tinylm import checkpoint_share
from tinylm.cli import main
from tinylm.train.checkpoint_io import AtomicCheckpointIO

pytestmark = pytest.mark.slow  # end-to-end runs, a resume each (run early: tests/conftest.py)
STEPS = 8
MUON_MODERN = {"optimizer": "muon", "positions": "rope", "norm": "rmsnorm", "qk_norm": True, "mlp": "swiglu",
               "tie_embeddings": False, "logit_softcap": 15.0, "zero_init_proj": True}


@pytest.fixture
def config(run_config, request):
    """Everything exact resume must survive: dropout, accumulation, loader workers, validation in between; with
    `model` parametrized (indirect), also Muon's momentum buffers beside AdamW's moments."""
    return run_config(
        chars=40_000,
        seed_everything=3,
        run={"name": "straight", "checkpoint_every": 2, "keep_checkpoints": -1},
        trainer={"max_steps": STEPS, "accumulate_grad_batches": 2, "val_check_interval": 6},  # val after steps 3, 6
        model={"dropout": 0.1, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "decay_steps": STEPS,
               **getattr(request, "param", {})},
        data={"block_size": 32, "batch_size": 4, "val_batches": 2, "num_workers": 2},
    )


@pytest.mark.parametrize("resume_from, config, given", [("last", {}, False), ("step-2.ckpt", {}, True),
                                                          ("last", MUON_MODERN, True)],
                         ids=["last-no-config", "step-2", "muon-modern-last"], indirect=["config"])
def test_resumed_run_matches_uninterrupted_run(config, tmp_path, resume_from, given, monkeypatch):
    """Catches non-exact resume: replayed or skipped batches, fresh RNG (dropout), lost optimizer/scheduler state
    (with Muon: a momentum buffer not saved or restored to the wrong matrix); (`given` False) a resume with only the
    run (no --config) not going on as the run did: its settings come from the run's config.yaml. From step-2.ckpt,
    also with one step's files sharing their bytes (hard links, as a user who is not root gets them without
    reflinks)."""
    if resume_from != "last":
        monkeypatch.setattr(checkpoint_share, "hard_links_are_safe", lambda: True)
        monkeypatch.setattr(checkpoint_share, "clone_file", lambda src, dst: False)
    main(["fit", "--config", str(config)])
    straight = _losses(tmp_path / "runs" / "straight")
    assert sorted(straight) == list(range(STEPS))

    # interrupted at step 4 (same schedule length), then resumed to the end: from last.ckpt in the same run folder,
    # or from the earlier step-2.ckpt branched into a new folder (rewinding a run in place is refused)
    main(["fit", "--config", str(config), "--run.name", "resumed", "--trainer.max_steps", "4"])
    run = tmp_path / "runs" / "resumed"
    ckpt = "last" if resume_from == "last" else str(run / "checkpoints" / resume_from)
    start = 4 if resume_from == "last" else 2
    name = "resumed" if resume_from == "last" else "branch"
    at_stop = (run / "checkpoints" / "step-4.ckpt").read_bytes()
    if resume_from != "last":  # step-4 and last: one file (best.ckpt, saved after the validation that a run's
        # unscheduled last step adds, holds another loop state: a file of its own)
        assert (run / "checkpoints" / "step-4.ckpt").stat().st_ino == (run / "checkpoints" / "last.ckpt").stat().st_ino
    # without --config as a user who kept only the run: its config.yaml has the dropout, accumulation, workers and
    # data; --trainer.max_steps is the user's flag over its 4
    again = ["--config", str(config)] if given else []
    if not given:
        config.unlink()  # gone: only the run is left
    main(["fit", *again, "--run.name", name, "--ckpt_path", ckpt, "--trainer.max_steps", str(STEPS)])
    resumed = _losses(tmp_path / "runs" / name)
    # the step the run went on from is not saved again from inside the next step's accumulation (its first
    # micro-batch's gradients would be lost to a resume from it)
    assert (run / "checkpoints" / "step-4.ckpt").read_bytes() == at_stop

    expected = list(range(STEPS)) if resume_from == "last" else list(range(start, STEPS))
    assert sorted(resumed) == expected  # one CSV, continued, no duplicated steps
    for step in expected:
        assert resumed[step] == pytest.approx(straight[step], abs=1e-4), f"step {step} (resumed from {start})"
    assert straight[STEPS - 1] != straight[0]  # not vacuous: the losses do change


def test_samples_once_per_step_across_a_resume_under_accumulation(run_config, tmp_path):
    """Catches text samples taken per micro-batch: a fresh run with accumulation sampled the untrained step 0, and
    a resumed run sampled its first step again; and samples written after the checkpoint by a killed run being
    kept beside the resumed run's own (the metrics CSV drops its rows after the checkpoint)."""
    prompt = "a\n--- step 99 | b\n"  # a line of the text that looks like a sample's header (byte-level BPE)
    config = run_config(run={"checkpoint_every": 2}, trainer={"max_steps": 4, "accumulate_grad_batches": 2},
                        samples={"every_n_steps": 2, "max_new_tokens": 4, "prompts": [prompt]},
                        model={"decay_steps": 6}, data={"tokenizer": "bpe", "vocab_size": 300})
    main(["fit", "--config", str(config)])
    samples = tmp_path / "runs" / "tiny" / "samples.txt"
    at_stop = samples.read_text(encoding="utf-8")
    with open(samples, "a", encoding="utf-8") as f:
        f.write(f"--- step 6 | {prompt!r}\nwritten after step-4.ckpt by a run killed before it saved again\n")
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6"])
    text = samples.read_text(encoding="utf-8")
    assert re.findall(rf"^--- step (\d+) \| {re.escape(repr(prompt))}$", text, flags=re.MULTILINE) == ["2", "4", "6"]
    assert "killed" not in text and text.startswith(at_stop)


def test_an_extended_run_takes_its_first_step_at_the_new_schedules_lr(run_config, tmp_path, caplog):
    """Catches the first step after `--ckpt_path last --trainer.max_steps` (longer, decay_steps unset) using the old
    schedule's LR, restored with the optimizer: the warning promised the new one."""
    from tinylm.train.schedules import lr_at

    config = run_config(trainer={"max_steps": 4}, model={"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 1})
    main(["fit", "--config", str(config)])
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8"])
    assert "the LR jumps from" in caplog.text
    with open(tmp_path / "runs" / "tiny" / "csv" / "metrics.csv") as f:
        lrs = {int(r["step"]): float(r["train/lr"]) for r in csv.DictReader(f) if r.get("train/lr")}
    new = {s: lr_at(s, schedule="cosine", lr=1e-3, min_lr=1e-4, warmup_steps=1, decay_steps=8) for s in range(4, 8)}
    assert {s: lrs[s] for s in new} == pytest.approx(new, rel=1e-6)


def test_an_epoch_of_an_odd_number_of_batches_ends_on_a_whole_step(run_config, tmp_path):
    """Catches a notional epoch whose batches are not a multiple of accumulate_grad_batches: Lightning ends an epoch
    with an optimizer step (here on one micro-batch of two) and counts validations over all batches, so after the
    first epoch every validation, and the best.ckpt it saves, fell inside a step (not resumable exactly)."""
    from tinylm.data import TinyLMDataModule

    config = run_config(chars=2750, run={"checkpoint_every": 5, "keep_checkpoints": -1},
                        trainer={"max_steps": 30, "accumulate_grad_batches": 2, "val_check_interval": 4},
                        data={"batch_size": 3}, model={"decay_steps": 30})
    dm = TinyLMDataModule(corpus=str(tmp_path / "shakespeare_small.txt"), tokenizer="char", block_size=16,
                          batch_size=3, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    assert (dm.train_dataloader().epoch_length) % 2 == 1  # the case: an odd epoch, crossed by the run
    main(["fit", "--config", str(config)])
    for ckpt in sorted((tmp_path / "runs" / "tiny" / "checkpoints").glob("*.ckpt")):
        state = torch.load(ckpt, weights_only=True, mmap=True)
        batches = state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["ready"]
        assert batches == 2 * state["global_step"], ckpt.name  # saved between two whole steps
    last = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
    assert last["epoch"] >= 1  # the run crossed the epoch's end
    # and the periodic save at the epoch's last batch (step 25) is not put off to the next validation (Lightning's)
    steps = sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "runs" / "tiny" / "checkpoints").glob("step-*.ckpt"))
    assert steps == [5, 10, 15, 20, 25, 30]


class MicroBatches(L.Callback):
    """Records each training micro-batch in `seen`: (the optimizer step it goes into, its windows' tokens)."""

    seen: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        MicroBatches.seen.append((trainer.global_step, batch[0].tolist()))


def test_a_resume_with_another_accumulation_steps_on_whole_accumulations_across_epochs(run_config, tmp_path):
    """Catches a resume whose notional epoch has another length than the run's (another accumulation here; another
    device count, tests/process/test_elastic.py) ending Lightning's epoch where the loader's does not: Lightning
    counted the epoch's micro-batches on from the run's (20, in an epoch of 14) and took the first resumed step on
    one micro-batch of two (its gradient halved), then the loader's epoch ended after one micro-batch more, whose
    gradient the next epoch's first step dropped. Epochs of 14 micro-batches of 2 x 16 here, resumed at step 10."""
    config = run_config(chars=500, run={"checkpoint_every": 5}, trainer={"max_steps": 22, "val_check_interval": 5},
                        model={"decay_steps": 22})  # (a validation at step 10: the checkpoint is saved after it)
    record = ["--trainer.callbacks+=test_resume.MicroBatches"]
    MicroBatches.seen = []
    main(["fit", "--config", str(config), "--run.name", "straight", *record])
    straight = [x for _, x in MicroBatches.seen]
    main(["fit", "--config", str(config), "--run.name", "resumed", "--trainer.max_steps", "10"])
    MicroBatches.seen = []
    main(["fit", "--config", str(config), "--run.name", "resumed", "--ckpt_path", "last", "--trainer.max_steps", "16",
          "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "10", *record])
    assert [x for _, x in MicroBatches.seen] == straight[10:22]  # the run's next micro-batches, each once
    assert [s for s, _ in MicroBatches.seen] == [s for s in range(10, 16) for _ in range(2)]  # two a step


def test_a_timed_stop_at_an_epochs_last_batch_resumes_exactly(run_config, tmp_path, monkeypatch):
    """Catches the checkpoint of a --trainer.max_time stop that lands on a notional epoch's last batch being saved
    after the extra validation Lightning runs there: Lightning's loop state then said the epoch's batches were all
    done but not the epoch, and the resumed run trained one batch more in it (a one-micro-batch step) and went on
    other batches. Here epochs are 3 steps of 2 micro-batches; the timer runs out at step 3."""
    from lightning.pytorch.callbacks.timer import Timer

    config = run_config(chars=260, run={"name": "straight", "checkpoint_every": 5},
                        trainer={"max_steps": 8, "accumulate_grad_batches": 2, "val_check_interval": 4},
                        model={"dropout": 0.1, "lr": 3e-3, "decay_steps": 8})
    main(["fit", "--config", str(config)])
    with monkeypatch.context() as m:  # the budget runs out at step 3, the first epoch's end
        m.setattr(Timer, "_check_time_remaining",
                  lambda self, trainer: setattr(trainer, "should_stop",
                                                trainer.should_stop or trainer.global_step >= 3))
        main(["fit", "--config", str(config), "--run.name", "timed", "--trainer.max_time", "01:00:00:00"])
    assert sorted(_losses(tmp_path / "runs" / "timed")) == [0, 1, 2]
    main(["fit", "--config", str(config), "--run.name", "timed", "--ckpt_path", "last"])
    _assert_same_rows(_losses(tmp_path / "runs" / "timed"), _losses(tmp_path / "runs" / "straight"))


def _snapshot_after_saving(monkeypatch, run: Path, copy: Path, *, step: int, name: str = "last.ckpt") -> None:
    """Copy ``run`` to ``copy`` right after its ``name`` of ``step`` is written: what a `kill -9` then leaves."""
    save = AtomicCheckpointIO.save_checkpoint

    def save_then_snapshot(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        if Path(path).name == name and checkpoint["global_step"] == step and not copy.exists():
            shutil.copytree(run, copy)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_snapshot)


def test_kill_after_a_validation_steps_checkpoint_keeps_its_validation(run_config, tmp_path, monkeypatch):
    """Catches a checkpoint taken between a step and its validation: a run killed in that gap resumed past the
    validation, so its val/loss row and its best.ckpt candidate were lost (and the CSV lost unflushed rows)."""
    config = run_config(run={"name": "straight", "checkpoint_every": 2},
                        trainer={"max_steps": 4, "val_check_interval": 2})
    straight, killed = tmp_path / "runs" / "straight", tmp_path / "runs" / "killed"
    _snapshot_after_saving(monkeypatch, straight, killed, step=2)
    main(["fit", "--config", str(config)])
    assert (killed / "checkpoints" / "best.ckpt").is_file()

    main(["fit", "--config", str(config), "--run.name", "killed", "--ckpt_path", "last"])
    assert sorted(_val_losses(straight)) == [1, 3]  # validations after steps 2 and 4 (rows store step - 1)
    _assert_same_rows(_val_losses(killed), _val_losses(straight))
    _assert_same_rows(_losses(killed), _losses(straight))


def test_kill_right_after_a_checkpoint_keeps_its_steps_row(run_config, tmp_path, monkeypatch):
    """Catches a checkpoint saved before its own step's CSV row: Lightning logs the row after on_train_batch_end,
    where the checkpoint is written, so a `kill -9` during the save of last.ckpt (after step-N.ckpt) lost the row of
    step N for good (the resume goes on from step N + 1)."""
    config = run_config(run={"name": "straight", "checkpoint_every": 2},
                        trainer={"max_steps": 4, "val_check_interval": 4})
    straight, killed = tmp_path / "runs" / "straight", tmp_path / "runs" / "killed"
    _snapshot_after_saving(monkeypatch, straight, killed, step=2)
    main(["fit", "--config", str(config)])
    assert sorted(_losses(killed)) == [0, 1]  # the rows of steps 1 and 2, on disk with step 2's checkpoint

    main(["fit", "--config", str(config), "--run.name", "killed", "--ckpt_path", "last"])
    assert sorted(_losses(straight)) == [0, 1, 2, 3]
    _assert_same_rows(_losses(killed), _losses(straight))


@pytest.mark.parametrize("name, step, keep", [("best.ckpt", 2, -1), ("step-4.ckpt", 4, 1)],
                         ids=["after-best-mid-run", "after-step-n-at-the-end"])
def test_a_kill_inside_a_save_leaves_no_checkpoint_of_its_step_missing(run_config, tmp_path, monkeypatch, name, step,
                                                                       keep):
    """Catches a save cut by a `kill -9` after best.ckpt (or step-N.ckpt) but before the step's other files:
    `--ckpt_path last` went on from that file and never wrote step-N.ckpt (run.keep_checkpoints -1 kept every
    step's checkpoint but that one); killed so in the final save, the run kept a last.ckpt steps behind (and the
    step-N.ckpt beyond run.keep_checkpoints). The resume completes the save: the folder is the straight run's.
    Mid-run, with one step's files sharing their bytes (read-only hard links, a user's who is not root)."""
    if step == 2:
        monkeypatch.setattr(checkpoint_share, "hard_links_are_safe", lambda: True)
        monkeypatch.setattr(checkpoint_share, "clone_file", lambda src, dst: False)
    config = run_config(run={"name": "straight", "checkpoint_every": 2, "keep_checkpoints": keep},
                        trainer={"max_steps": 4, "val_check_interval": 2})
    straight, killed = tmp_path / "runs" / "straight", tmp_path / "runs" / "killed"
    _snapshot_after_saving(monkeypatch, straight, killed, step=step, name=name)
    main(["fit", "--config", str(config)])
    assert torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2 if step == 4 \
        else not (killed / "checkpoints" / "last.ckpt").exists()  # (not vacuous: the save was cut)

    resume = ["fit", "--config", str(config), "--run.name", "killed", "--ckpt_path", "last"]
    if step == 4:  # the run's last step: nothing is left to train, but its files are completed first
        with pytest.raises(SystemExit):
            main(resume)
    else:
        main(resume)
    names = sorted(p.name for p in (straight / "checkpoints").iterdir())
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == names
    for file in names:
        want, got = (torch.load(run / "checkpoints" / file, weights_only=True) for run in (straight, killed))
        assert got["global_step"] == want["global_step"], file
        assert all(torch.allclose(got["state_dict"][k], v, atol=1e-6) for k, v in want["state_dict"].items()), file
    _assert_same_rows(_losses(killed), _losses(straight))
    _assert_same_rows(_val_losses(killed), _val_losses(straight))


def test_a_resume_refused_for_a_lower_max_steps_leaves_the_cut_save_alone(run_config, tmp_path, monkeypatch):
    """Catches `--ckpt_path last` with a --trainer.max_steps below the newest checkpoint's step taking that
    checkpoint for a cut final save: the refused command ("nothing to train") first wrote step-N.ckpt and last.ckpt
    and removed the older step-N.ckpt beyond run.keep_checkpoints, the one a resume to the lower max_steps needs."""
    config = run_config(run={"name": "killed", "checkpoint_every": 3, "keep_checkpoints": 1},
                        trainer={"max_steps": 4, "val_check_interval": 2})
    run, killed = tmp_path / "runs" / "run", tmp_path / "runs" / "killed"
    _snapshot_after_saving(monkeypatch, killed, run, step=4, name="best.ckpt")  # a kill in the final save
    main(["fit", "--config", str(config)])
    shutil.rmtree(killed)
    run.rename(killed)
    before = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert before == ["best.ckpt", "last.ckpt", "step-3.ckpt"], before  # (not vacuous: the save was cut)

    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3"])
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == before
    assert torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3


@pytest.mark.parametrize("cut", ["0", "0,3,1.2"], ids=["before-step", "inside-row"])
def test_resume_past_a_cut_csv_row(run_config, tmp_path, cut):
    """Catches `--ckpt_path last` failing (TypeError) or keeping a half row when a crash cut metrics.csv's last
    append short."""
    config = run_config(trainer={"max_steps": 4})
    main(["fit", "--config", str(config)])
    path = tmp_path / "runs" / "tiny" / "csv" / "metrics.csv"
    whole = path.read_text()
    path.write_text(whole + cut)  # a row whose append was cut off: no newline

    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6"])
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r["train/loss"]] == list(range(6))
    assert all(r["train/loss"] or r["val/loss"] for r in rows)  # no half row kept
    assert path.read_text().startswith(whole)  # every whole row kept


def test_resume_on_a_notional_epoch_boundary_keeps_dropout_exact(run_config, tmp_path):
    """Catches the training loader drawing its base seed from the global torch RNG (no generator of its own): a
    new epoch's iterator then advances that RNG in the uninterrupted run, but before the restored RNG state in the
    resumed one, so every dropout mask after a checkpoint on an epoch boundary differed. Epochs of 3 steps here
    (100 train tokens, batches of 2 x 16), checkpoint and interruption after step 3."""
    config = run_config(
        chars=200,
        run={"name": "straight", "checkpoint_every": 3},
        trainer={"max_steps": 6, "val_check_interval": 3},
        model={"dropout": 0.1, "lr": 3e-3, "warmup_steps": 1, "decay_steps": 6},
        data={"val_fraction": 0.5},
    )
    main(["fit", "--config", str(config)])
    from tinylm.data import TinyLMDataModule

    dm = TinyLMDataModule(corpus=str(tmp_path / "shakespeare_small.txt"), tokenizer="char", block_size=16,
                          batch_size=2, val_fraction=0.5, cache_dir=str(tmp_path / "cache"))
    assert dm.train_dataloader().epoch_length == 3
    straight = _losses(tmp_path / "runs" / "straight")
    main(["fit", "--config", str(config), "--run.name", "resumed", "--trainer.max_steps", "3"])
    main(["fit", "--config", str(config), "--run.name", "resumed", "--ckpt_path", "last"])
    resumed = _losses(tmp_path / "runs" / "resumed")
    assert sorted(resumed) == sorted(straight) == list(range(6))
    for step in range(6):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-5), f"step {step}"


def test_train_loss_is_the_optimizer_steps_mean_whatever_the_accumulation(run_config):
    """Batch k of size B holds global samples k*B .. k*B + B - 1, so 2 micro-batches of B are the batch of 2B: the
    logged train/loss (one row a step, the mean over its micro-batches) must not depend on the split."""
    config = run_config(chars=40_000, trainer={"max_steps": 4, "val_check_interval": 100},
                        data={"block_size": 16, "batch_size": 8})
    main(["fit", "--config", str(config), "--run.name", "whole"])
    main(["fit", "--config", str(config), "--run.name", "split", "--data.batch_size", "4",
          "--trainer.accumulate_grad_batches", "2"])
    whole, split = _losses(config.parent / "runs" / "whole"), _losses(config.parent / "runs" / "split")
    assert list(split) == list(whole) == [0, 1, 2, 3]
    assert all(len(rows) == 1 for rows in split.values()), split
    assert [r[0] for r in split.values()] == pytest.approx([r[0] for r in whole.values()], abs=1e-5)


def test_a_run_that_ends_between_two_validations_validates_at_its_last_step(run_config, tmp_path):
    """Catches a run whose max_steps is not a multiple of its validation interval ending without a final val/loss
    (or its last step's train/loss):
    a quick try of 3 steps at val_check_interval 100 had no val/loss row and no best.ckpt (so the README's
    `generate --ckpt_path .../best.ckpt` failed). The checkpoint of the last step is saved before that validation,
    so a resume with a larger max_steps still matches the uninterrupted run (dropout, accumulation, workers)."""
    config = run_config(chars=40_000, run={"name": "straight", "checkpoint_every": 2},
                        trainer={"max_steps": 6, "accumulate_grad_batches": 2, "val_check_interval": 200},
                        model={"dropout": 0.1, "lr": 3e-3, "decay_steps": 6},
                        data={"block_size": 32, "batch_size": 4, "num_workers": 2})
    main(["fit", "--config", str(config)])
    straight = tmp_path / "runs" / "straight"
    assert sorted(_val_losses(straight)) == [5]  # after step 6 only (rows store step - 1)

    main(["fit", "--config", str(config), "--run.name", "short", "--trainer.max_steps", "3"])
    short = tmp_path / "runs" / "short"
    assert sorted(_val_losses(short)) == [2]
    assert (short / "checkpoints" / "best.ckpt").is_file()
    assert torch.load(short / "checkpoints" / "best.ckpt", weights_only=False)["global_step"] == 3

    main(["fit", "--config", str(config), "--run.name", "short", "--ckpt_path", "last"])
    assert sorted(_val_losses(short)) == [2, 5]
    assert _val_losses(short)[5] == pytest.approx(_val_losses(straight)[5], abs=1e-4)
    _assert_same_rows(_losses(short), _losses(straight))

    # the last step logs its own training metrics too (Lightning logged the previous logging step's again under it)
    main(["fit", "--config", str(config), "--run.name", "sparse", "--trainer.max_steps", "3",
          "--trainer.log_every_n_steps", "2"])
    sparse = tmp_path / "runs" / "sparse"
    assert sorted(_losses(sparse)) == sorted(_losses(sparse, "train/tokens_per_sec")) == [1, 2]
    _assert_same_rows(_losses(sparse), {step: _losses(straight)[step] for step in (1, 2)})
    assert sorted(_val_losses(sparse)) == [2]


def test_resume_and_validate_take_the_runs_data_not_the_configs(run_config, tmp_path, caplog, capsys):
    """Catches a resume or a `validate --config` needing `--data.corpus` again: a run trained on a corpus given by
    flag, resumed and evaluated with a config that names data not to be had here (a file that is gone, as a hub
    dataset offline), reads the run's own corpus and tokenizer (from its checkpoint; the resume's fingerprint check
    still guards the text), says so in a line, and a flag still overrides them."""
    import yaml

    cfg = run_config(trainer={"max_steps": 2, "val_check_interval": 2})
    run_corpus = str(tmp_path / "shakespeare_small.txt")
    other = yaml.safe_load(cfg.read_text())
    other["data"].update(corpus=str(tmp_path / "gone.txt"), tokenizer="bpe")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    main(["fit", "--config", str(cfg)])
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(tmp_path / "other.yaml"), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    assert f"data.corpus={run_corpus!r} (not {str(tmp_path / 'gone.txt')!r})" in caplog.text
    assert "data.tokenizer='char' (not 'bpe')" in caplog.text
    rows = list(csv.DictReader(open(tmp_path / "runs" / "tiny" / "csv" / "metrics.csv")))
    assert max(int(r["step"]) for r in rows if r.get("train/loss")) == 3  # it trained on: steps 2 and 3
    main(["validate", "--config", str(tmp_path / "other.yaml"), "--ckpt_path", "last"])
    evaluated = list(csv.DictReader(open(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")))
    assert evaluated[-1]["step"] == "4"
    with pytest.raises(SystemExit):  # a flag is the user's word: the gone file is read, and refused
        main(["validate", "--config", str(tmp_path / "other.yaml"), "--ckpt_path", "last", "--data.corpus",
              str(tmp_path / "gone.txt")])
    assert "gone.txt' not found" in capsys.readouterr().err


def test_a_run_alone_resumes_and_validates_on_its_own_data(run_config, tmp_path, monkeypatch, caplog):
    """Catches `tinylm fit --ckpt_path RUN/checkpoints/last.ckpt` and `tinylm validate --ckpt_path .../best.ckpt`
    with no --config reading tinylm's defaults (tinyshakespeare, block_size 256, ./data_cache): the resume failed on
    the model's shape after preparing a second dataset. The run's own config.yaml gives the data and the settings,
    the prepared dataset is reused, a flag still overrides, and from another folder the corpus the run named by a
    relative path is the file it read."""
    cfg = run_config()
    main(["fit", "--config", str(cfg), "--data.batch_size", "3",  # flags: only the run remembers them
          "--data.corpus", "shakespeare_small.txt"])
    cfg.unlink()
    run = Path("runs", "tiny")
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--trainer.max_steps", "3"])
    assert f"the run's own settings, from {run / 'config.yaml'}" in caplog.text
    assert sorted(_losses(tmp_path / run)) == [0, 1, 2]  # steps 0-1, then 2 on the run's batch size 3
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1  # the run's dataset, made once
    assert not (tmp_path / "tinylm_cache").exists()  # (the default cache: nothing prepared there)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with caplog.at_level("INFO", logger="tinylm"):
        main(["validate", "--ckpt_path", str(tmp_path / run / "checkpoints" / "best.ckpt")])
    assert f"reading the file the run read, {tmp_path / 'shakespeare_small.txt'}" in caplog.text
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1
    rows = list(csv.DictReader(open(tmp_path / run / "validate" / "metrics.csv")))
    assert len(rows) == 1 and rows[0]["step"] in ("2", "3") and float(rows[0]["val/loss"]) > 0


def test_a_checkpoint_alone_resumes_exactly(run_config, tmp_path, caplog):
    """Catches a checkpoint outside its run folder (copied, downloaded: DESIGN, "a checkpoint is enough on its own
    to resume training exactly") resumed with the defaults' settings: gradient clipping off (losses off by 3e-3),
    another validation and logging interval, W&B on, and the run's batch and block sizes refused one at a time. The
    checkpoint keeps the run's config; the command's flags still override it, and its run folder is its own."""
    cfg = run_config(trainer={"max_steps": 8, "gradient_clip_val": 0.01, "val_check_interval": 4},
                     run={"name": "whole", "checkpoint_every": 4, "keep_checkpoints": -1},
                     model={"dropout": 0.1}, data={"block_size": 24, "batch_size": 3})
    main(["fit", "--config", str(cfg)])
    cfg.unlink()
    (tmp_path / "lone").mkdir()
    shutil.copy(tmp_path / "runs" / "whole" / "checkpoints" / "step-4.ckpt", tmp_path / "lone" / "x.ckpt")
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--ckpt_path", "lone/x.ckpt", "--run.name", "branch"])
    assert "lone/x.ckpt: the run's own settings, from the checkpoint" in caplog.text
    whole, branch = tmp_path / "runs" / "whole", tmp_path / "runs" / "branch"
    _assert_same_rows(_losses(branch), {s: v for s, v in _losses(whole).items() if s >= 4})
    _assert_same_rows(_val_losses(branch), {s: v for s, v in _val_losses(whole).items() if s >= 4})
    assert not (branch / "wandb").exists() and not (tmp_path / "runs" / "whole" / "wandb").exists()
    # a flag overrides, and is compared with the checkpoint's settings (not with a config.yaml that happens to be
    # beside its folder: a project's, no record of this run)
    (tmp_path / "config.yaml").write_text("trainer:\n  gradient_clip_val: 5.0\n")
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--ckpt_path", "lone/x.ckpt", "--run.name", "longer", "--trainer.max_steps", "9",
              "--trainer.gradient_clip_val", "0.5"])
    assert max(_losses(tmp_path / "runs" / "longer")) == 8
    assert "trainer.gradient_clip_val 0.5 (the run had 0.01)" in caplog.text
    # a run folder copied without its config records: the checkpoint's settings, and its own folder
    (tmp_path / "runs" / "copy" / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "lone" / "x.ckpt", tmp_path / "runs" / "copy" / "checkpoints" / "step-4.ckpt")
    main(["fit", "--ckpt_path", "last", "--run.name", "copy"])
    _assert_same_rows(_losses(tmp_path / "runs" / "copy"), _losses(branch))
    # a checkpoint of an older tinylm (no settings kept) alone: said, with the way to go on as the run did
    old = torch.load(tmp_path / "lone" / "x.ckpt", weights_only=True)
    del old["tinylm"]["config"]
    torch.save(old, tmp_path / "lone" / "old.ckpt")
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"), pytest.raises(SystemExit):  # (the defaults' batch: refused)
        main(["fit", "--ckpt_path", "lone/old.ckpt", "--run.name", "old"])
    assert "lone/old.ckpt keeps no settings of its run" in caplog.text and "pass the run's own --config" in caplog.text


def test_a_checkpoint_alone_that_is_none_is_named(tmp_path, capsys, monkeypatch):
    """Catches `tinylm fit --ckpt_path TYPO --run.name NEW` (no --config: the checkpoint's settings are read) refused
    as "trainer.max_steps is not set": the missing, broken or foreign file was left to the resume's own checks."""
    from helpers import _one_line_error

    monkeypatch.chdir(tmp_path)
    torch.save({"a": torch.ones(2)}, tmp_path / "plain.pt")
    (tmp_path / "cut.ckpt").write_bytes(b"PK\x03\x04" + b"\0" * 20)
    for path, said in (("nothere.ckpt", "checkpoint 'nothere.ckpt' not found"),
                       ("plain.pt", "'plain.pt' is a torch file but not a Lightning checkpoint"),
                       ("cut.ckpt", "'cut.ckpt' is not a readable checkpoint")):
        _one_line_error(capsys, ["fit", "--ckpt_path", path, "--run.name", "new"], said)
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_of_nan_weights_is_refused_by_resume_and_validate(run_config, tmp_path, capsys):
    """Catches a diverged run's checkpoint (NaN weights) resumed (it trained from NaN, and the guard blamed the LR)
    or validated (`val/loss nan`, exit 0, its next lines naming generate and export, which refuse it)."""
    from helpers import _one_line_error

    cfg = run_config(trainer={"max_steps": 2})
    main(["fit", "--config", str(cfg)])
    ckpt = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["state_dict"]["model.transformer.ln_f.weight"][0] = float("nan")
    torch.save(ckpt, tmp_path / "nan.ckpt")
    said = f"checkpoint '{tmp_path / 'nan.ckpt'}' holds non-finite weights (NaN or inf) in 1 tensors"
    _one_line_error(capsys, ["fit", "--config", str(cfg), "--ckpt_path", str(tmp_path / "nan.ckpt"),
                             "--run.name", "again", "--trainer.max_steps", "4"], said, "use an earlier step-*.ckpt")
    _one_line_error(capsys, ["validate", "--ckpt_path", str(tmp_path / "nan.ckpt")], said)


def test_a_checkpoint_of_nan_optimizer_state_is_refused_by_resume_only(run_config, tmp_path, capsys):
    """Catches a resume of a checkpoint whose weights are finite but whose optimizer moments hold NaN (saved the
    step a run diverged): every step after it was NaN, and the run stopped or rolled back steps later without
    naming the file (with samples on, it ended in torch.multinomial's traceback). The resume is one line naming
    the file and the state; validate, which reads the weights only, still scores it."""
    from helpers import _one_line_error

    cfg = run_config(trainer={"max_steps": 2})
    main(["fit", "--config", str(cfg)])
    ckpt = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["optimizer_states"][0]["state"][0]["exp_avg"].fill_(float("nan"))
    torch.save(ckpt, tmp_path / "nan.ckpt")
    said = (f"checkpoint '{tmp_path / 'nan.ckpt'}' holds a non-finite optimizer state (NaN or inf) in 1 tensors, "
            "e.g. 'exp_avg' of parameter 0")
    _one_line_error(capsys, ["fit", "--config", str(cfg), "--ckpt_path", str(tmp_path / "nan.ckpt"),
                             "--run.name", "again", "--trainer.max_steps", "4"], said, "use an earlier step-*.ckpt")
    capsys.readouterr()
    main(["validate", "--ckpt_path", str(tmp_path / "nan.ckpt")])
    assert "non-finite" not in capsys.readouterr().err
    from tinylm.train.module import TinyLM

    TinyLM.load_from_checkpoint(tmp_path / "nan.ckpt", map_location="cpu")  # (Python's load of the weights: no trainer)


def test_a_run_whose_tokenizer_file_is_gone_resumes_with_the_checkpoints(run_config, tmp_path, small_bpe, caplog,
                                                                         capsys):
    """Catches a run trained with --data.tokenizer PATH whose file was moved or deleted since refused on resume
    ("tokenizer path not found", naming only options that are other tokenizers), though its checkpoint holds that
    tokenizer (validate, generate and export read it): the resume reads the checkpoint's, and its dataset."""
    (tmp_path / "tok").mkdir()
    shutil.copy(small_bpe.tiktoken, tmp_path / "tok" / "small.tiktoken")
    cfg = run_config(data={"tokenizer": "tiktoken:tok/small.tiktoken"}, trainer={"max_steps": 2})
    main(["fit", "--config", str(cfg)])
    ranks = tmp_path / "tok" / "small.tiktoken"
    kept = ranks.read_text()
    lines = kept.splitlines()  # edited in place: two tokens swap their ids
    (a, ra), (b, rb) = lines[300].split(), lines[301].split()
    lines[300:302] = [f"{a} {rb}", f"{b} {ra}"]
    ranks.write_text("\n".join(lines) + "\n")
    from helpers import _one_line_error  # (it named two equal specs as two tokenizers: "resume with the one ...")

    _one_line_error(capsys, ["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "3"],
                    "data.tokenizer 'tiktoken:tok/small.tiktoken' is not the tokenizer the checkpoint was trained "
                    "with under that name", "its file changed since, or the relative path names another file from "
                    f"this working folder ({tmp_path})", "put the run's file back, or move it away")
    shutil.rmtree(tmp_path / "tok")
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "3"])
    assert "data.tokenizer tiktoken:tok/small.tiktoken is not found; using the tokenizer the checkpoint holds" \
        in caplog.text
    assert max(_losses(tmp_path / "runs" / "tiny")) == 2
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1  # the run's dataset, not another


def test_a_resume_to_another_tokenizer_is_refused_before_the_data_is_prepared(run_config, tmp_path, capsys,
                                                                              small_bpe):
    """Catches a resume with --data.vocab_size (a BPE run) or --data.tokenizer of another kind training that
    tokenizer and packing the whole corpus (half an hour at a recipe's size) before it was refused as "a different
    model shape", naming neither option: one line naming the option, and nothing prepared."""
    from helpers import _one_line_error

    cfg = run_config(data={"tokenizer": "bpe", "vocab_size": 300})
    main(["fit", "--config", str(cfg)])
    made = sorted(p for p in (tmp_path / "cache").rglob("*") if p.name != "fingerprints.json")  # (no preparing)
    resume = ["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "4"]
    _one_line_error(capsys, [*resume, "--data.vocab_size", "320"], "data.vocab_size 320 (the run's BPE: 300)")
    _one_line_error(capsys, [*resume, "--data.tokenizer", "char"], "data.tokenizer 'char' (the run's: 'bpe')")
    _one_line_error(capsys, [*resume, "--data.tokenizer", f"tiktoken:{small_bpe.tiktoken}"],  # another file
                    f"data.tokenizer 'tiktoken:{small_bpe.tiktoken}' (512 ids; the run's: 'bpe', 300 ids)")
    assert sorted(p for p in (tmp_path / "cache").rglob("*") if p.name != "fingerprints.json") == made
    # a config of another vocab_size and the data section typed whole: its one option is what it types (the
    # section counted as typing every data option: refused, then trained a BPE of the config's size)
    other = yaml.safe_load(cfg.read_text())
    other["data"]["vocab_size"] = 8192
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    main(["fit", "--config", str(tmp_path / "other.yaml"), "--ckpt_path", "last", "--trainer.max_steps", "3",
          "--data", "{val_batches: 1}"])
    assert max(_losses(tmp_path / "runs" / "tiny")) == 2


class _ValLossBetween(L.Callback):
    """Scores every validation ``value`` (in place of the model's mean, before the module logs it): a later model worse
    than the best so far and better than the one before it, whatever the tiny model learns."""

    value = 0.0

    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.val_loss.reset()
        pl_module.val_loss.update(torch.tensor(self.value))


def test_an_extended_run_keeps_the_best_of_its_final_validation(run_config, tmp_path):
    """Catches best.ckpt replaced by a worse model after a run is extended (`--ckpt_path last --trainer.max_steps`
    larger): its last step saved last.ckpt before the validation that ends the run between two scheduled ones, so the
    resume compared its validations with the score before that one, not with the one best.ckpt held."""
    cfg = run_config(trainer={"max_steps": 3, "val_check_interval": 2}, run={"checkpoint_every": 2},
                     model={"lr": 3e-3})
    main(["fit", "--config", str(cfg)])
    run = tmp_path / "runs" / "tiny"
    vals = {step: v[-1] for step, v in _val_losses(run).items()}
    best = run / "checkpoints" / "best.ckpt"
    assert sorted(vals) == [1, 2] and vals[2] < vals[1]  # not vacuous: the final validation (step 3) is the best
    assert torch.load(best, weights_only=True)["global_step"] == 3
    _ValLossBetween.value = (vals[1] + vals[2]) / 2
    main(["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "4",
          "--trainer.callbacks+=test_resume._ValLossBetween"])
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    assert torch.load(best, weights_only=True)["global_step"] == 3


def test_a_run_killed_in_its_final_validation_runs_it_on_resume(run_config, tmp_path, monkeypatch, capsys):
    """Catches the resume of a run killed during the validation that ends it between two scheduled ones (GPT-2's
    19,073 steps at val_check_interval 250): its last step's checkpoints are saved before that validation, and
    `--ckpt_path last` was refused as "nothing to train" (exit 1), the final val/loss row, best.ckpt's look at the
    final model and the end summary lost for good. The resume runs that validation alone (the straight run's rows
    and best.ckpt, exit 0); a run whose final validation ran still has nothing to train."""
    from tinylm.train.callbacks import PeriodicCheckpoint

    cfg = run_config(trainer={"max_steps": 3, "val_check_interval": 2}, run={"checkpoint_every": 2},
                     model={"lr": 3e-3})
    straight, killed = tmp_path / "runs" / "tiny", tmp_path / "runs" / "killed"

    def snapshot(self, trainer, pl_module):  # what a `kill -9` as the final validation starts leaves
        if trainer.global_step == 3 and not killed.exists():
            shutil.copytree(straight, killed)

    monkeypatch.setattr(PeriodicCheckpoint, "on_validation_start", snapshot, raising=False)
    main(["fit", "--config", str(cfg)])
    assert sorted(_val_losses(straight)) == [1, 2] and sorted(_val_losses(killed)) == [1]  # (not vacuous)
    assert torch.load(killed / "checkpoints" / "best.ckpt", weights_only=True)["global_step"] == 2
    capsys.readouterr()

    main(["fit", "--config", str(cfg), "--run.name", "killed", "--ckpt_path", "last"])
    assert "run killed done: step 3: its final validation, no step" in capsys.readouterr().out
    _assert_same_rows(_val_losses(killed), _val_losses(straight))
    _assert_same_rows(_losses(killed), _losses(straight))
    want, got = (torch.load(run / "checkpoints" / "best.ckpt", weights_only=True) for run in (straight, killed))
    assert got["global_step"] == want["global_step"] == 3  # the final model, the best here
    assert all(torch.equal(got["state_dict"][k], v) for k, v in want["state_dict"].items())
    with pytest.raises(SystemExit) as e:  # validated now: nothing is left to do
        main(["fit", "--config", str(cfg), "--run.name", "killed", "--ckpt_path", "last"])
    assert e.value.code == 1 and "nothing to train" in capsys.readouterr().err


def test_a_users_val_loss_checkpoint_joins_best_ckpt_and_old_checkpoints_keep_their_best(run_config, tmp_path):
    """Catches `--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.monitor val/loss` (top-k by val/loss, as
    Lightning's docs show) ending in a traceback: tinylm's best.ckpt keyed its state as the same ModelCheckpoint
    ("Found more than one stateful callback"). A checkpoint written before best.ckpt had a key of its own resumes
    with its best score: best.ckpt is not replaced by a worse model."""
    cfg = run_config(trainer={"max_steps": 4, "val_check_interval": 2}, run={"checkpoint_every": 2})
    main(["fit", "--config", str(cfg), "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor",
          "val/loss", "--trainer.callbacks.save_top_k", "2", "--trainer.callbacks.filename", "top-{step}"])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    assert torch.load(ckpts / "best.ckpt", weights_only=True)["global_step"] == 4
    assert len(list((tmp_path / "runs" / "tiny").rglob("top-step=*.ckpt"))) == 2  # the user's, by val/loss
    saved = torch.load(ckpts / "last.ckpt", weights_only=True)
    ours = next(k for k in saved["callbacks"] if k.startswith("BestCheckpoint{"))
    old = saved["callbacks"].pop(ours)  # as tinylm wrote it before: a plain ModelCheckpoint's key
    low = torch.tensor(-1.0)  # a best score no validation beats
    saved["callbacks"][ours.replace("BestCheckpoint", "ModelCheckpoint", 1)] = {
        **old, "best_model_score": low, "kth_value": low, "best_k_models": dict.fromkeys(old["best_k_models"], low)}
    (ckpts / "last.ckpt").unlink()  # (for a user who is not root, a read-only hard link of step-4.ckpt and best.ckpt)
    torch.save(saved, ckpts / "last.ckpt")
    main(["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "6"])
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 6
    assert torch.load(ckpts / "best.ckpt", weights_only=True)["global_step"] == 4  # -1 (the old key's) stays best


def test_a_resumes_warmup_warning_gives_advice_a_resume_can_follow(run_config, recwarn):
    """Catches a resume told to "lower --model.warmup_steps", an option the resume ignores (the run's model options
    are the checkpoint's)."""
    cfg = run_config(model={"warmup_steps": 5}, trainer={"max_steps": 2, "val_check_interval": 2})
    main(["fit", "--config", str(cfg)])
    assert any("lower --model.warmup_steps" in str(w.message) for w in recwarn.list)
    recwarn.clear()
    main(["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    said = [str(w.message) for w in recwarn.list if "warmup outlasts the run" in str(w.message)]
    assert len(said) == 1 and "lengthen the run (--trainer.max_steps: a resume keeps the run's model options)" \
        in said[0], said


def test_the_lr_jump_of_an_extended_schedule_is_told_in_digits_that_differ(caplog):
    """Catches a run extended by a few steps at its end told that "the LR jumps from 0.0001 to 0.0001" (three
    digits of two LRs that differ further down)."""
    from tinylm.cli.resume_changes import warn_schedule_change
    from tinylm.train.schedules import lr_at

    hparams = {"lr_schedule": "cosine", "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 100, "decay_steps": None}
    was = lr_at(2000, schedule="cosine", lr=1e-3, min_lr=1e-4, warmup_steps=100, decay_steps=2000, decay_fraction=0.2)
    ckpt = {"global_step": 2000, "lr_schedulers": [{"_last_lr": [was]}]}
    with caplog.at_level("WARNING", logger="tinylm"):
        warn_schedule_change(ckpt, hparams, 2010, "x.ckpt")
    jump = re.search(r"the LR jumps from (\S+) to (\S+) and", caplog.text)
    assert jump and jump[1] != jump[2], caplog.text


@pytest.mark.parametrize("max_steps, said", [(40, None), (50, ("0.00944", "0.0138"))])
def test_the_lr_jump_after_a_guard_rollback_counts_its_lower_peak(caplog, max_steps, said):
    """Catches a resume of a run whose stability guard had halved the LR (the scheduler's base LRs) warned of a jump
    from the halved LR to the whole one: with model.decay_steps pinned there is none, and an extended run jumps to
    half the new schedule's LR, as it then trains."""
    from tinylm.cli.resume_changes import warn_schedule_change
    from tinylm.train.schedules import lr_at

    pinned = max_steps == 40
    hparams = {"lr_schedule": "cosine", "lr": 0.05, "min_lr": 0.005, "warmup_steps": 0,
               "decay_steps": 40 if pinned else None}
    was = 0.5 * lr_at(25, schedule="cosine", lr=0.05, min_lr=0.005, warmup_steps=0, decay_steps=40, decay_fraction=0.2)
    ckpt = {"global_step": 25, "lr_schedulers": [{"_last_lr": [was], "base_lrs": [0.025]}]}
    with caplog.at_level("WARNING", logger="tinylm"):
        warn_schedule_change(ckpt, hparams, max_steps, "x.ckpt")
    jump = re.search(r"the LR jumps from (\S+) to (\S+) and", caplog.text)
    assert (jump.groups() if jump else None) == said, caplog.text


def test_last_on_a_running_fit_is_not_called_a_stopped_one(tmp_path, caplog):
    """Catches `tinylm validate --ckpt_path last` during a fit warning that the run "stopped between two saves": a
    running fit saves step-N.ckpt first and last.ckpt next, so the newer step-N.ckpt is taken, said as the running
    run's order of saves (the run folder's lock names who runs); a folder nobody holds is a stopped run."""
    import fcntl

    from tinylm.cli.resume import latest_checkpoint

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for name, step in (("last.ckpt", 4), ("step-6.ckpt", 6)):
        torch.save({"state_dict": {}, "global_step": step, "tinylm": {"format": 1}}, folder / name)
    with caplog.at_level("WARNING", logger="tinylm"):
        assert latest_checkpoint(tmp_path / "run") == str(folder / "step-6.ckpt")
    assert "the run stopped between two saves" in caplog.text
    caplog.clear()
    with open(tmp_path / "run" / ".lock", "w") as lock:  # another open file: held as another process holds it
        lock.write("pid 4242")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with caplog.at_level("WARNING", logger="tinylm"):
            assert latest_checkpoint(tmp_path / "run") == str(folder / "step-6.ckpt")
    assert "stopped" not in caplog.text and "is at step 4, behind it (the run is running there, pid 4242" in caplog.text


def test_a_copied_checkpoint_validates_on_the_file_the_run_read(run_config, tmp_path, monkeypatch, caplog):
    """Catches `tinylm validate --ckpt_path COPY.ckpt` from another folder, for a run that named its corpus by a
    relative path: it said "reading the file the run read, /abs/corpus.txt" and then failed with "corpus
    'corpus.txt' not found" (data_from put the run's relative name back over the found file); and the run's own
    file, found from another folder, was announced as "evaluating on the validation split of data.corpus /abs/..."
    as if it were another corpus."""
    import shutil

    cfg = run_config()
    main(["fit", "--config", str(cfg), "--data.corpus", "shakespeare_small.txt"])
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", tmp_path / "elsewhere" / "copy.ckpt")
    monkeypatch.chdir(tmp_path / "elsewhere")
    with caplog.at_level("INFO", logger="tinylm"):
        main(["validate", "--ckpt_path", "copy.ckpt", "--data.cache_dir", str(tmp_path / "cache")])
    assert f"reading the file the run read, {tmp_path / 'shakespeare_small.txt'}" in caplog.text
    rows = list(csv.DictReader(open(tmp_path / "elsewhere" / "validate" / "metrics.csv")))
    assert len(rows) == 1 and float(rows[0]["val/loss"]) > 0
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):
        main(["validate", "--ckpt_path", str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")])
    assert "evaluating on the validation split" not in caplog.text  # the run's own corpus, not another



def test_a_nanogpt_checkpoint_is_named_with_the_way_on(tmp_path):
    """Catches nanoGPT's ckpt.pt (or a plain state_dict) refused as "not a Lightning checkpoint (no 'state_dict')"
    with no word of what to pass instead (the house rule: the bad value and the fix)."""
    from tinylm.checkpoint import CheckpointError, load_checkpoint

    torch.save({"model": {"transformer.wte.weight": torch.ones(2, 2)}, "model_args": {"n_layer": 1},
                "iter_num": 0}, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"nanoGPT's ckpt.pt.*tinylm fit.*--model.init_from DIR"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_a_requeued_job_goes_on_only_from_the_run_it_trained(tmp_path, monkeypatch):
    """Catches a requeued SLURM job (SLURM_RESTART_COUNT=1) silently taking over an earlier job's run of the same
    --run.name (its fit refused without the requeue), ignoring the job's own model options, and rewriting its
    last.ckpt / best.ckpt."""
    from tinylm.cli.resume import requeued
    from tinylm.cli.run_folder import holds_run

    run = tmp_path / "run"
    (run / "csv").mkdir(parents=True)
    (run / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,0,4.1\n")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    (run / "slurm_job_id").write_text("77\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step-2.ckpt").write_bytes(b"cut")
    # the job's own run whose checkpoints are all damaged: refused by the run folder's check alone (it said "going on
    # from the newest checkpoint" first)
    assert requeued(None, run, "fit") is None and (run / "csv" / "metrics.csv").exists()
    (run / "checkpoints" / "step-2.ckpt").unlink()
    # one that saved none (stopped before its first save): trained again from step 0, its logged rows kept aside (it
    # was refused, and the requeue lost with nobody there to start it again)
    assert requeued(None, run, "fit") is None and not holds_run(run)
    assert (run / "csv" / "metrics.before-requeue-1.csv").read_text() == "epoch,step,train/loss\n0,0,4.1\n"
    torch.save({"state_dict": {}, "global_step": 3, "tinylm": {"format": 1}}, run / "checkpoints" / "last.ckpt")
    (run / "slurm_job_id").unlink()
    assert requeued(None, run, "fit") is None  # refused as a fresh run over it, as without the requeue
    (run / "slurm_job_id").write_text("76\n")
    assert requeued(None, run, "fit") is None
    (run / "slurm_job_id").write_text("77\n")  # the run this job trained (check_run_folder records it)
    assert requeued(None, run, "fit") == "last"


def test_a_requeued_job_goes_on_from_the_newer_of_its_checkpoints_and_lightnings_hpc_save(tmp_path, monkeypatch):
    """Catches a requeued SLURM job going on from its run's last.ckpt when Lightning's save on SIGUSR1
    (hpc_ckpt_N.ckpt, in the run folder) is steps ahead of it (the run killed before the step it stopped at ended):
    the steps between, saved, trained again; and going on from the hpc save, inexact, when last.ckpt is newer."""
    from tinylm.cli.resume import requeued

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    (run / "slurm_job_id").write_text("77\n")
    torch.save({"state_dict": {}, "global_step": 250, "tinylm": {"format": 1}}, run / "checkpoints" / "best.ckpt")
    torch.save({"state_dict": {}, "global_step": 480, "tinylm": {"format": 1}}, run / "hpc_ckpt_1.ckpt")
    assert requeued(None, run, "fit") == str(run / "hpc_ckpt_1.ckpt")
    torch.save({"state_dict": {}, "global_step": 480, "tinylm": {"format": 1}}, run / "checkpoints" / "last.ckpt")
    assert requeued(None, run, "fit") == "last"  # the run's own save at that step: exact
    torch.save({"state_dict": {}, "global_step": 90, "tinylm": {"format": 1}}, run / "hpc_ckpt_2.ckpt")
    assert requeued(None, run, "fit") == "last"  # (hpc_ckpt_2 is an older step: its number is no step)


def test_a_run_on_a_dataset_folders_data_files_keyed_by_an_older_tinylm_resumes(run_config, tmp_path):
    """Catches a run trained on `hf:DIR --data.data_files ...` before such data files were keyed by their contents
    (its checkpoints hold `datasets`' fingerprint of the files' paths and mtimes, as tinylm then keyed them) refused
    on its resume after the upgrade: "trained on other text than data.corpus 'hf:ds' holds now (its fingerprint
    changed: the files were edited or replaced)", of the very files it trained on."""
    import hashlib
    import json

    from tinylm.data.corpus import open_corpus

    text = (Path(__file__).parents[1] / "fixtures" / "tinyshakespeare_100k.txt").read_text()[:4000].split("\n\n")
    (folder := tmp_path / "ds").mkdir()
    for name, part in (("train", text[:-3]), ("validation", text[-3:])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    files = {"train": "train.jsonl", "validation": "validation.jsonl"}
    config = run_config(data={"corpus": "hf:ds", "data_files": files})
    main(["fit", "--config", str(config)])
    corpus = open_corpus("hf:ds", cache_dir=tmp_path / "cache", data_files=files)
    dd = corpus._load()
    key = {"path": corpus.path, "config": corpus.config, "revision": corpus.revision, "split": corpus.split,
           "val_split": corpus.val_split if corpus.has_validation else None, "column": corpus.text_column,
           "data": {k: getattr(dd[k], "_fingerprint", None) for k in sorted(dd)}}  # (the key before the upgrade)
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    ckpt["TinyLMDataModule"]["corpus_fingerprints"] = [hashlib.sha256(json.dumps(
        key, sort_keys=True, default=str).encode()).hexdigest()]
    torch.save(ckpt, last)
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    assert torch.load(last, weights_only=True)["global_step"] == 4


@pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML built without libyaml")
def test_a_resume_reads_the_runs_config_records_with_libyaml(tmp_path, monkeypatch):
    """Catches a resume reading its run's config records (config.yaml, config.resume-step<N>.yaml, the checkpoint's
    copy) with PyYAML's pure-Python parser: ~40 ms a tiny run's config.yaml, two or three per resume, ~8x libyaml's.
    What they hold is read as yaml.safe_load reads it (a run named 3e-4 stays a name), and a copy holding a lone
    surrogate is no YAML to read, as before (not a UnicodeEncodeError out of libyaml)."""
    import yaml.composer

    from tinylm.cli.argv import reloadable_yaml
    from tinylm.cli.run_folder import kept_settings, read_yaml

    settings = {"seed_everything": 7, "run": {"name": "3e-4", "wandb_project": None, "keep_checkpoints": -1},
                "trainer": {"max_steps": 8, "gradient_clip_val": 1.0, "callbacks": [{"class_path": "a.B"}]},
                "model": {"lr": 3e-4, "n_embd": 32}, "data": {"corpus": "données/t.txt", "val_batches": None}}
    text = reloadable_yaml(settings)
    (path := tmp_path / "config.yaml").write_text(text, encoding="utf-8")

    def pure_python(*args, **kwargs):
        raise AssertionError("parsed by PyYAML's pure-Python parser")

    monkeypatch.setattr(yaml.composer.Composer, "compose_document", pure_python)
    assert read_yaml(path) == settings
    assert kept_settings({"tinylm": {"config": text}}) == settings
    monkeypatch.undo()
    assert kept_settings({"tinylm": {"config": "run:\n  name: \udce9\n"}}) == {}


def test_a_branch_from_an_older_checkpoint_compares_with_the_settings_that_trained_it(tmp_path, caplog):
    """Catches a branch from step-2.ckpt of a run resumed at step 4 with another gradient clipping compared with
    that later resume's record (config.resume-step4.yaml): the clipping that trained step-2.ckpt was warned of as a
    change ("trainer.gradient_clip_val 1.0 (the run had 0.5)"), and the later one, a change for the branch, passed
    in silence. The checkpoint keeps the settings of the command that saved it."""
    from jsonargparse import Namespace

    from tinylm.cli.resume_changes import warn_training_changes

    def settings(clip: float) -> dict:
        return {"trainer": {"gradient_clip_val": clip, "precision": "32-true", "accumulate_grad_batches": 1},
                "data": {"batch_size": 4}}

    (run := tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (run.parent / "config.yaml").write_text(yaml.safe_dump(settings(1.0)))
    (run.parent / "config.resume-step4.yaml").write_text(yaml.safe_dump(settings(0.5)))
    ckpt = {"global_step": 2, "tinylm": {"format": 1, "config": yaml.safe_dump(settings(1.0))}}
    said = {}
    for clip in (1.0, 0.5):
        cfg = Namespace(trainer=Namespace(**settings(clip)["trainer"]), data=Namespace(batch_size=4))
        caplog.clear()
        with caplog.at_level("WARNING", logger="tinylm"):
            warn_training_changes(cfg, str(run / "step-2.ckpt"), ckpt=ckpt)
        said[clip] = caplog.text
    assert "the run had" not in said[1.0], said[1.0]
    assert "trainer.gradient_clip_val 0.5 (the run had 1.0)" in said[0.5]


def test_a_resume_without_clipping_as_the_run_had_none_is_not_told_of_a_change(tmp_path, caplog):
    """Catches a resume of a run trained with `--trainer.gradient_clip_val 0` (clipping off) under a config that
    leaves it unset warned of "trainer.gradient_clip_val None (the run had 0.0): the resumed steps train with the new
    value": 0 and unset both clip nothing (TinyLM.configure_gradient_clipping); 1.0 is a change."""
    from jsonargparse import Namespace

    from tinylm.cli.resume_changes import warn_training_changes

    trainer = {"gradient_clip_val": 0.0, "precision": "32-true", "accumulate_grad_batches": 1}
    ckpt = {"global_step": 2, "tinylm": {"format": 1, "config": yaml.safe_dump({"trainer": trainer})}}
    said = {}
    for clip in (None, 1.0):
        caplog.clear()
        with caplog.at_level("WARNING", logger="tinylm"):
            warn_training_changes(Namespace(trainer=Namespace(**{**trainer, "gradient_clip_val": clip}),
                                            data=Namespace()), str(tmp_path / "x.ckpt"), ckpt=ckpt)
        said[clip] = caplog.text
    assert "the run had" not in said[None], said[None]
    assert "trainer.gradient_clip_val 1.0 (the run had 0.0)" in said[1.0]


def test_a_resume_on_the_gpu_of_a_cpu_run_with_its_precision_unset_is_told_of_the_change(tmp_path, caplog,
                                                                                         monkeypatch):
    """Catches a run trained with `--trainer.accelerator cpu` on a GPU machine, its precision unset (32-true there:
    device.resolve_precision's CPU rule), resumed on the GPU (bf16-mixed) without a word: the run's unset precision
    was resolved as the GPU's, whatever accelerator it had, and so compared equal; and the other way round."""
    from jsonargparse import Namespace

    from tinylm.cli.resume_changes import warn_training_changes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with a GPU (an A100: bf16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    said = {}
    for had, now in (("cpu", "auto"), ("auto", "cpu"), ("cpu", "cpu")):
        trainer = {"gradient_clip_val": None, "precision": None, "accumulate_grad_batches": 1, "accelerator": had}
        ckpt = {"global_step": 2, "tinylm": {"format": 1, "config": yaml.safe_dump({"trainer": trainer})}}
        caplog.clear()
        with caplog.at_level("WARNING", logger="tinylm"):
            warn_training_changes(Namespace(trainer=Namespace(**{**trainer, "accelerator": now}), data=Namespace()),
                                  str(tmp_path / "x.ckpt"), n_embd=32, ckpt=ckpt)
        said[had, now] = caplog.text
    assert "trainer.precision 'bf16-mixed' (the run had '32-true')" in said["cpu", "auto"], said
    assert "trainer.precision '32-true' (the run had 'bf16-mixed')" in said["auto", "cpu"], said
    assert "the run had" not in said["cpu", "cpu"], said
