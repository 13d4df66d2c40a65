"""The suite's own guards against a hang: a child a test forks is reaped within a time limit, and a test worker is
back on one torch thread after every test (a child forked after a multi-thread operator hung in its own); and the
fork server's DDP rank 1 (tests/forked.py) starts as a fresh one would."""

import ast
import json
import os
import time
from pathlib import Path

import forked
import lightning.pytorch as L
import pytest
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only


def test_a_forked_child_that_never_ends_is_killed_and_fails_the_test():
    """Catches reap waiting on a deadlocked child for good (as os.waitpid(pid, 0) does), or leaving it
    running (with a copy of the test worker's pipes)."""
    child = os.fork()
    if child == 0:  # pragma: no cover (a child: sleeps until killed)
        try:
            time.sleep(600)
        finally:
            os._exit(0)
    start = time.monotonic()
    with pytest.raises(AssertionError, match=rf"the child forked by this test \(pid {child}\) still ran after 0 s"):
        forked.reap(child, 0.3)
    assert time.monotonic() - start < 10
    with pytest.raises(ChildProcessError):  # killed and reaped: no such child any more
        os.waitpid(child, os.WNOHANG)
    quick = os.fork()
    if quick == 0:  # pragma: no cover
        os._exit(3)
    assert os.waitstatus_to_exitcode(forked.reap(quick, 30)) == 3


def test_a_child_forked_after_a_two_thread_operator_runs_once_torch_is_back_on_one_thread():
    """The fix conftest's _one_torch_thread makes after every test: a process whose operators ran on 2 threads,
    then set back to 1, forks a child whose operators (on the 1 thread it inherits) finish. Forked at 2 threads, the
    child's first parallel operator waited for good on OpenMP threads that exist only in the parent (and so does a
    child that raises its own count: a forked child of a test worker stays on one thread)."""
    torch.set_num_threads(2)
    torch.full((4_000_000,), 1.0).add_(1).sum()  # large enough to run in parallel: OpenMP's pool starts
    torch.set_num_threads(1)
    child = os.fork()
    if child == 0:  # pragma: no cover (a child: leaves at once)
        code = 1
        try:
            code = 0 if torch.full((4_000_000,), 2.0).add_(1).sum().item() == 12_000_000 else 2
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(forked.reap(child, 60)) == 0


def test_no_test_waits_for_its_own_forked_child_without_a_limit():
    """Catches a new `os.waitpid(pid, 0)` on a child a test forked (one deadlocked child held the suite for good):
    forked.reap waits with a limit. A script a test runs in another process (a string here) may wait as it likes."""
    tests = Path(__file__).parent
    unbounded = []
    for path in sorted(tests.rglob("*.py")):
        if path.name == "forked.py":  # reap itself, and the fork server (a process of its own)
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.waitpid" and len(node.args) == 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value == 0:
                unbounded.append(f"{path.relative_to(tests)}:{node.lineno}")
    assert not unbounded, f"wait with forked.reap(pid, timeout): {unbounded}"


class SayHowThisRankStarted(L.Callback):
    """Each rank writes, at its setup: its pid, its parent's, Lightning's rank for it, torch's C++ log level and
    threads, and its name in /proc (rank<N>.json)."""

    def setup(self, trainer, pl_module, stage):
        import ctypes
        import json

        c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        Path(f"rank{trainer.global_rank}.json").write_text(json.dumps({
            "pid": os.getpid(), "parent": os.getppid(), "rank_zero_only": rank_zero_only.rank,
            "cpp_log_level": ctypes.c_int.in_dll(c10, "FLAGS_caffe2_log_level").value,
            "threads": torch.get_num_threads(), "comm": Path("/proc/self/comm").read_text().strip()}))


@pytest.mark.process
def test_a_forked_ddp_runs_rank_1_is_forked_from_it_and_starts_as_a_fresh_one_would(run_config, tmp_path):
    """Catches tests/forked.py's rank 1 (forked from the run, to spare a fresh interpreter's imports) starting
    otherwise than the fresh `python -m tinylm.__main__` that DDP's launcher starts: another process's child (its
    watch of rank 0 reads its parent), Lightning's rank 0 (it took the run folder's lock: "in use by another tinylm
    process"), torch's C++ log at the import's level (rank 0 sets ERROR for the ranks it starts: a gloo warning with
    its C++ stack), or a fresh interpreter after all (the saving gone)."""
    config = run_config(run={"name": "run"}, trainer={"max_steps": 1})
    env = {**{k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    done = forked.run(["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
                       "--trainer.strategy", "ddp", "--trainer.callbacks+=test_harness.SayHowThisRankStarted"],
                      cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank1["parent"] == rank0["pid"], (rank0, rank1)
    assert (rank0["rank_zero_only"], rank1["rank_zero_only"]) == (0, 1)
    assert rank1["cpp_log_level"] == 2 and rank1["threads"] == 1, rank1  # ERROR, as rank 0 set it for its ranks
    assert rank1["comm"] == "tinylm-rank1", rank1
