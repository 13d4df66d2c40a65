"""The environments users run tinylm in: a shell that once ran torchrun (RANK left set), a pipe whose reader goes
away (`tinylm fit | head`), a closed stdout (`>&-`), the C locale, an sbatch job without srun."""

import os
import subprocess
import sys
from pathlib import Path

import forked
import pytest

pytestmark = pytest.mark.process  # runs whole `tinylm` processes (tests/process)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--data.tokenizer", "char", "--data.block_size", "8", "--data.batch_size", "2", "--model.n_layer", "1",
        "--model.n_head", "1", "--model.n_embd", "8", "--run.wandb_project", "null", "--samples.every_n_steps", "0"]


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, hello tinylm\n" * 400)
    return corpus


@pytest.mark.parametrize("stray", ["RANK", "NODE_RANK"])
def test_a_stray_rank_does_not_skip_the_run_folder_refusal(tmp_path, stray):
    """Catches RANK=1 (or NODE_RANK=1, left from a node started by hand) in a shell (no launcher: WORLD_SIZE and
    MASTER_ADDR unset) making a lone `tinylm fit` a silent rank 1 that skipped the run folder's checks and overwrote an
    earlier run's best.ckpt / last.ckpt."""
    (tmp_path / "runs" / "x" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "config.yaml").write_text("x: 1\n")
    old = tmp_path / "runs" / "x" / "checkpoints" / "last.ckpt"
    old.write_bytes(b"old run")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MASTER_ADDR")} | {stray: "1"}
    done = forked.run(["fit", "--run.name", "x", "--data.corpus", str(_corpus(tmp_path)), *TINY,
                       "--trainer.max_steps", "2"], cwd=tmp_path, env=env, timeout=300)
    assert old.read_bytes() == b"old run"
    assert done.returncode == 1 and "refusing to start a fresh run over it" in done.stderr, done.stderr[-2000:]
    assert f"ignoring {stray}=1: no launcher started this process" in done.stderr


def test_a_fit_whose_stdout_reader_goes_away_stops_and_saves(tmp_path):
    """Catches `tinylm fit ... | head -2` ending the run at once with 141, unsaved and without a word on stderr."""
    os.mkfifo(tmp_path / "out")
    proc = forked.popen(["fit", "--run.name", "x", "--data.corpus", str(_corpus(tmp_path)), *TINY,
                         "--trainer.max_steps", "400", "--trainer.log_every_n_steps", "1", "--run.checkpoint_every",
                         "1000"], cwd=tmp_path, stdout=str(tmp_path / "out"), stderr=str(tmp_path / "err"))
    try:
        with open(tmp_path / "out") as reader:  # reads the first progress line, then goes away
            next(line for line in reader if line.startswith("steps:"))
        assert proc.wait(timeout=300) == 141
    finally:
        proc.end()
    err = (tmp_path / "err").read_text()
    assert "interrupted by SIGPIPE" in err and "Traceback" not in err, err[-2000:]
    assert (tmp_path / "runs" / "x" / "checkpoints" / "last.ckpt").is_file()


def _python(code: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, **kwargs,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_closed_stdout_is_not_a_traceback():
    """Catches `tinylm prepare ... >&-` (Python makes sys.stdout None) ending in "AttributeError: 'NoneType' object
    has no attribute 'write'" from the first progress line (a fit: no checkpoint saved)."""
    done = _python("from tinylm.cli import console; console.setup(); console.write('steps: 1\\n')",
                   stdout=None, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()


def test_stdout_takes_non_ascii_text_under_lc_all_c():
    """Catches `LC_ALL=C tinylm generate ...` ending a sample with a non-ASCII character in UnicodeEncodeError."""
    env = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    done = _python(r"from tinylm.cli import console; console.setup(); console.write('\u201cN\xe4he\u201d\n')", env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout == "\u201cNähe\u201d\n".encode()


def test_a_utf8_prompt_typed_under_lc_all_c_is_read_as_utf8():
    """Catches `--prompt 'Nähe'` under LC_ALL=C (Python decodes the argument as ASCII, each byte a surrogate) refused
    as "the prompt is not valid UTF-8"."""
    from tinylm.generate.prompts import encode_prompt

    class Chars:
        def encode(self, text):
            return [ord(c) for c in text]

    text, ids = encode_prompt(Chars(), "N\udcc3\udca4he")
    assert text == "Nähe" and ids == [ord(c) for c in "Nähe"]


def test_slurm_ntasks_without_per_node_is_one_line(monkeypatch):
    """Catches `sbatch --ntasks=2 job.sh` running `tinylm fit` without srun ending in Lightning's RuntimeError
    traceback ("You set --ntasks=2 in your SLURM bash script...")."""
    from tinylm.cli.trainer_checks import check_trainer_options

    for var in ("MASTER_ADDR", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    with pytest.raises(ValueError, match="SLURM_NTASKS=2 .* SLURM_NTASKS_PER_NODE is unset"):
        check_trainer_options({"accelerator": "cpu", "max_steps": 10}, "fit")


def test_a_callers_basicconfig_prints_each_line_once(tmp_path):
    """Catches `logging.basicConfig()` in a script before `main(["fit", ...])` printing every line twice: tinylm's
    ("CPU threads: 1 ..." and "INFO:tinylm:CPU threads: 1 ..."), and Lightning's ("INFO: GPU available: ..." by the
    "lightning" package's handler and "INFO:lightning.pytorch...:GPU available: ..." by the root's)."""
    args = ["fit", "--run.name", "x", "--data.corpus", str(_corpus(tmp_path)), *TINY, "--trainer.max_steps", "1"]
    done = _python(f"import logging; logging.basicConfig(); from tinylm.cli import main; main({args!r})",
                   {"OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-2000:]
    assert err.count("CPU threads: ") == 1 and err.count("GPU available: ") == 1, err
