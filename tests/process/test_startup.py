"""What a command does before its heavy imports (issue 35): `prepare` without torch or Lightning at all, a refusal
(a missing config file, a run folder another process writes) and a kept `--help` before them. Each runs `tinylm` in
a process of its own, which reports the modules it imported (a process already holding torch proves nothing)."""

import fcntl
import gc
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # runs whole `tinylm` processes (tests/process)

# `tinylm ARGS` in a fresh interpreter, then one JSON line: its exit status and whether torch / Lightning came in
WRAPPER = """
import json, sys
from tinylm.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "lightning": "lightning" in sys.modules}))
"""


def _tinylm(*args: str, env: dict | None = None) -> tuple[dict, str, str]:
    """(the report, stdout before it, stderr) of `tinylm ARGS` run in a process of its own."""
    done = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    *out, report = done.stdout.rstrip("\n").split("\n")
    return json.loads(report), "\n".join(out), done.stderr


def test_prepare_imports_neither_torch_nor_lightning(run_config, tmp_path):
    """Catches `tinylm prepare` importing torch and Lightning (seconds of start-up, 2.8x the peak memory of bare
    `tokenizers`) for work that needs neither: the tokenizer is trained, the dataset packed and summarised, twice
    (the second from the cache), and neither module is ever imported."""
    cfg = run_config(data={"tokenizer": "bpe", "vocab_size": 300})
    for _ in range(2):
        report, out, err = _tinylm("prepare", "--config", str(cfg))
        assert report == {"code": 0, "torch": False, "lightning": False}, err
        assert "train_tokens" in out and "bytes_per_token" in out
    datasets = list((tmp_path / "cache" / "datasets").iterdir())
    assert len(datasets) == 1 and (datasets[0] / "meta.json").is_file()


# `tinylm ARGS1`, `tinylm ARGS2`, ... (each a JSON list) in one fresh interpreter: their exit statuses, and whether
# Lightning came in
COMMANDS = """
import json, sys
from tinylm.cli import main
codes = []
for args in map(json.loads, sys.argv[1:]):
    try:
        main(args)
        codes.append(0)
    except SystemExit as e:
        codes.append(e.code)
print(json.dumps({"codes": codes, "lightning": "lightning" in sys.modules}))
"""


def test_the_commands_that_read_a_checkpoint_import_no_lightning(run_config, tmp_path):
    """Catches generate, sample-report, eval and export importing Lightning (its import pulls in torchmetrics and
    torch._dynamo: generate of a small model peaked at 1.8x the memory, 457 MB for 251, and spent 3x the CPU time),
    which they never use: it came from tinylm.checkpoint importing Lightning's checkpoint writer."""
    from tinylm.cli import main

    main(["fit", "--config", str(run_config(chars=100_000))])  # (characters enough for some of piqa's items)
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "evals"
    runs = [["generate", "--ckpt_path", ckpt, "--max_new_tokens", "8", "--seed", "1"],
            ["eval", "--ckpt_path", ckpt, "--tasks", "piqa", "--data_dir", str(fixtures)]]
    if importlib.util.find_spec("matplotlib"):
        runs.append(["sample-report", "--ckpt_path", ckpt, "--out", str(tmp_path / "report"), "--num_samples", "1",
                     "--max_new_tokens", "4"])
    if importlib.util.find_spec("transformers"):
        runs.append(["export", "--ckpt_path", ckpt, "--out", str(tmp_path / "hf")])
    done = subprocess.run([sys.executable, "-c", COMMANDS, *map(json.dumps, runs)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.rstrip("\n").split("\n")[-1])
    assert report == {"codes": [0] * len(runs), "lightning": False}, done.stderr[-3000:]


def test_refusals_come_before_the_imports(run_config, tmp_path):
    """Catches a config file that is not there, and a run folder another process holds, being refused only after
    torch and Lightning were imported (5-9 s on a quiet machine, minutes on a loaded one, for a one-line answer);
    also for a resume that names no --config, whose folder is the checkpoint's run (not the default runs/tinylm)."""
    report, _, err = _tinylm("fit", "--config", str(tmp_path / "nope.yaml"))
    assert report == {"code": 1, "torch": False, "lightning": False}
    assert "config file" in err and "nope.yaml' not found" in err
    cfg = run_config(run={"name": "busy"})
    run = tmp_path / "runs" / "busy"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(cfg.read_text())  # the run's record: a resume with no --config reads it
    with open(run / ".lock", "a+") as held:  # another process's hold on the folder, as tinylm takes it (flock)
        held.write("pid 4242")
        held.flush()
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
                                   "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)",
                                   str(run / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for args in (["--config", str(cfg)], ["--config", str(cfg), "--run.name=other", "--run.name", "busy"],
                     ["--ckpt_path", str(Path("runs") / "busy" / "checkpoints" / "last.ckpt")]):
            report, _, err = _tinylm("fit", *args)
            assert report == {"code": 1, "torch": False, "lightning": False}, err
            assert f"{Path('runs') / 'busy'} is in use by another tinylm process (pid 4242)" in err
    finally:
        holder.kill()
        holder.wait()
    with open(run / ".lock") as f:  # nothing left holding it: the early check let go of the lock it tried
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_help_is_kept_and_made_again_when_what_shapes_it_changes(tmp_path):
    """Catches `tinylm fit --help` importing Lightning every time (seconds, to print the same text), and a kept help
    shown after something that shapes it changed (here the terminal's width). The helps that are made (and kept) are
    forked from a process that imported Lightning once (tests/forked.py); the one that must not import it runs in a
    process of its own."""
    import forked

    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "COLUMNS": "100"}
    kept = tmp_path / "xdg" / "tinylm" / "help"

    def made(env: dict) -> str:  # the help made by `tinylm fit --help`, as _tinylm has it (its last newline cut)
        done = forked.run(["fit", "--help"], cwd=tmp_path, env={**os.environ, **env}, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.removesuffix("\n")

    text = made(env)
    assert "--data.corpus" in text and len(list(kept.glob("fit-*.txt"))) == 1  # made, and kept
    again, same, _ = _tinylm("fit", "--help", env=env)
    assert again == {"code": 0, "torch": False, "lightning": False} and same == text
    other = made({**env, "COLUMNS": "160"})
    assert other != text and "--data.corpus" in other and len(list(kept.glob("fit-*.txt"))) == 2  # made again


# `tinylm ARGS` as the process's own command (main() reads sys.argv), then one JSON line: the full passes of the
# garbage collector during it, the objects frozen out of its view, whether it is on
COLLECTOR = """
import gc, json, sys
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
from tinylm.cli import main
sys.argv = ["tinylm", *sys.argv[1:]]
code = 0
try:
    main()
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
print(json.dumps({"code": code, "full_passes": len(full), "frozen": gc.get_freeze_count(), "on": gc.isenabled()}))
"""


def test_the_garbage_collector_walks_the_imports_once(run_config, tmp_path):
    """Catches `tinylm fit` walking Lightning's ~450,000 imported objects again and again with the garbage
    collector (7 full passes during the import, and those of the interpreter's exit: ~2-3 s of the laptop recipe's
    ~14 s of CPU at 1 step, docs/benchmarks.md), and `tinylm generate`'s exit walking torch's (~0.5 s of ~3.5 s).
    Lightning's import runs with the collector paused, then one pass and gc.freeze; each command collects its own
    garbage as it ends and freezes what is left; a caller's own main([...]) leaves its process's collector as it
    was."""
    cli_main = importlib.import_module("tinylm.cli.main")  # (the module: `tinylm.cli.main` is also its function)

    def collector(*args: str) -> dict:
        done = subprocess.run([sys.executable, "-c", COLLECTOR, *args], capture_output=True, text=True, timeout=600)
        report = json.loads(done.stdout.rstrip("\n").split("\n")[-1])
        assert report["code"] == 0 and report["on"], done.stderr[-3000:]
        return report

    report = collector("fit", "--config", str(run_config()))
    assert report["full_passes"] <= 2 and report["frozen"] > 100_000, report  # (the import's pass, the end's)
    report = collector("generate", "--ckpt_path", str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"),
                       "--max_new_tokens", "4")
    assert report["frozen"] > 50_000, report
    frozen = gc.get_freeze_count()
    with cli_main._collector_paused(program=False):
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
