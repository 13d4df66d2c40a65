"""The suite's own guards against a hang: a child a test forks is reaped within a time limit, and a test worker is
back on one torch thread after every test (a child forked after a multi-thread operator hung in its own)."""

import ast
import os
import time
from pathlib import Path

import forked
import pytest
import torch


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
