"""Two tinylm processes at once: what one reads while another writes."""

import os
import shutil

import pytest

import tinylm.cli.fit as fit_module
from tinylm.cli import main

pytestmark = pytest.mark.process


def test_a_branch_from_a_checkpoint_replaced_between_its_two_reads_is_refused(run_config, tmp_path, capsys,
                                                                              monkeypatch):
    """`fit --ckpt_path runs/a/checkpoints/last.ckpt --run.name b` while run a saves last.ckpt: the command read the
    file for its settings and checks at one step, and Lightning loaded the next file, a later step. The branch said
    "resuming at step 2" and "N steps (from step 2)" while it trained from step 4."""
    config = run_config(run={"checkpoint_every": 2}, trainer={"max_steps": 4, "val_check_interval": 2})
    main(["fit", "--config", str(config)])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    loose = tmp_path / "live.ckpt"  # stands for run a's last.ckpt: step 2 when read, step 4 when loaded
    shutil.copy(ckpts / "step-2.ckpt", loose)
    read = fit_module.apply_checkpoint

    def then_a_save_lands(*args, **kwargs):  # the barrier: the running fit's save, between the two reads
        start = read(*args, **kwargs)
        tmp = loose.with_suffix(".tmp")
        shutil.copy(ckpts / "step-4.ckpt", tmp)
        tmp.replace(loose)
        return start

    monkeypatch.setattr(fit_module, "apply_checkpoint", then_a_save_lands)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(config), "--ckpt_path", str(loose), "--run.name", "b", "--trainer.max_steps", "6"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "Traceback" not in err, err
    assert "was replaced" in err and "step 2" in err and "step 4" in err, err
    assert not (tmp_path / "runs" / "b").exists()  # refused before it trained: no folder left


def _let_go_in_the_first_wait(monkeypatch, flags) -> list[float]:
    """The barrier of the two tests below: the other process holds the lock until this one, refused once, waits
    before its next try (run_lock's sleep): it lets go then (``flags``/release; ``flags``/released once it has).
    Held for a fixed 0.1 s instead, it was let go before a loaded machine's test process got to its lock (a stall
    of that length): the tests passed with run_lock's retries removed. The waits this process made, returned."""
    import time
    import types

    from tinylm.cli import run_lock

    waits = []

    def sleep(seconds: float) -> None:
        if not waits:
            (flags / "release").touch()
            deadline = time.monotonic() + 30
            while not (flags / "released").exists():
                assert time.monotonic() < deadline, "the other process never let go"
                time.sleep(0.005)
        waits.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(run_lock, "time", types.SimpleNamespace(sleep=sleep))
    return waits


def test_a_resume_is_not_refused_while_another_fit_only_tests_the_lock(tmp_path, monkeypatch):
    """Every `fit` tests its run folder's lock before its imports (early.check_run_folder_free -> running_holder) by
    taking it for a moment. A resume whose own lock fell in that moment was refused as "in use by another tinylm
    process (pid N)", N the run's last process, long gone, while the tester went on (or was itself refused: a fresh
    fit over the run), so neither ran."""
    import subprocess
    import sys
    import time

    from tinylm.cli.run_lock import lock_run_folder, release_run_folder

    run_dir, flags = tmp_path / "runs" / "x", tmp_path / "flags"
    run_dir.mkdir(parents=True)
    flags.mkdir()
    (run_dir / ".lock").write_text("pid 999999")  # what the run's last (finished) process left in it
    probe = ("import fcntl, pathlib, sys, time\n"
             "flags = pathlib.Path(sys.argv[2]); real = fcntl.flock\n"
             "def held(f, op):\n"  # the barrier: the tester says it holds the lock, and holds it until told
             "    real(f, op)\n"
             "    if not op & fcntl.LOCK_UN:\n"
             "        (flags / 'testing').touch()\n"
             "        while not (flags / 'release').exists(): time.sleep(0.005)\n"
             "fcntl.flock = held\n"
             "from tinylm.cli.run_lock import running_holder\n"
             "print(running_holder(pathlib.Path(sys.argv[1])), flush=True)\n"
             "(flags / 'released').touch()\n")
    waits = _let_go_in_the_first_wait(monkeypatch, flags)
    tester = subprocess.Popen([sys.executable, "-c", probe, str(run_dir), str(flags)], stdout=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 30
        while not (flags / "testing").exists():
            assert tester.poll() is None and time.monotonic() < deadline, "the tester never took the lock"
            time.sleep(0.005)
        lock_run_folder(run_dir)  # the resume's own lock, while the tester holds it
        assert (run_dir / ".lock").read_text() == f"pid {os.getpid()}"
        assert waits, "the resume's first try found the lock free: the test proved nothing"
    finally:
        (flags / "release").touch()
        release_run_folder(run_dir)
        out, _ = tester.communicate(timeout=30)
    assert out.strip() == "None"  # and the tester found no other holder either


def test_a_fit_that_opened_the_lock_as_its_holder_removed_it_does_not_share_the_folder(tmp_path):
    """A fit that fails before writing anything removes its run folder, lock file included (release_run_folders).
    A second fit that had opened that .lock just before, and locked it just after, held a lock on a removed file,
    in a folder removed under it: a third fit then made the folder again, locked a new .lock, and the two trained in
    one folder."""
    import subprocess
    import sys
    import time

    from tinylm.cli.run_lock import lock_run_folder, release_run_folders
    from tinylm.errors import TinyLMError

    run_dir, flags = tmp_path / "runs" / "x", tmp_path / "flags"
    flags.mkdir()
    second = ("import fcntl, pathlib, sys, time\n"
              "flags = pathlib.Path(sys.argv[2]); real = fcntl.flock\n"
              "def paused(f, op):\n"  # the barrier: its .lock opened, its flock only once the first has let go
              "    (flags / 'opened').touch()\n"
              "    while not (flags / 'released').exists(): time.sleep(0.005)\n"
              "    return real(f, op)\n"
              "fcntl.flock = paused\n"
              "from tinylm.cli.run_lock import lock_run_folder\n"
              "lock_run_folder(pathlib.Path(sys.argv[1])); fcntl.flock = real\n"
              "(flags / 'holds').touch()\n"
              "while not (flags / 'stop').exists(): time.sleep(0.005)\n")

    def wait_for(name: str) -> None:
        deadline = time.monotonic() + 30
        while not (flags / name).exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"the second fit never got to {name!r}"
            time.sleep(0.005)

    lock_run_folder(run_dir)  # the first fit
    proc = subprocess.Popen([sys.executable, "-c", second, str(run_dir), str(flags)])
    try:
        wait_for("opened")
        release_run_folders(failed=True)  # the first fit failed before writing anything: its folder goes
        (flags / "released").touch()
        wait_for("holds")
        assert (run_dir / ".lock").read_text() == f"pid {proc.pid}"  # the second holds the folder's own .lock
        with pytest.raises(TinyLMError, match=rf"in use by another tinylm process \(pid {proc.pid}\)"):
            lock_run_folder(run_dir)  # and a third is refused
    finally:
        (flags / "stop").touch()
        proc.wait(timeout=30)


def test_a_resume_is_not_refused_by_a_fit_that_holds_the_lock_only_to_be_refused(tmp_path, monkeypatch):
    """A fresh `fit` over an existing run takes the folder's lock, is refused, and lets go (~70 ms). A resume whose
    early check (before the imports) fell in that moment was refused as "in use by another tinylm process (pid N)",
    N the refused fit's, gone a moment later: its own lock would have waited for it (lock_run_folder's tries)."""
    import subprocess
    import sys
    import time

    from tinylm.cli.run_lock import check_not_in_use

    run_dir, flags = tmp_path / "runs" / "x", tmp_path / "flags"
    run_dir.mkdir(parents=True)
    flags.mkdir()
    refused = ("import pathlib, sys, time\n"
               "from tinylm.cli.run_lock import lock_run_folder, release_run_folders\n"
               "flags = pathlib.Path(sys.argv[2]); lock_run_folder(pathlib.Path(sys.argv[1]))\n"
               "(flags / 'holding').touch()\n"
               "while not (flags / 'release').exists(): time.sleep(0.005)\n"  # (what a refused fit holds it for)
               "release_run_folders(failed=True); (flags / 'released').touch()\n")
    waits = _let_go_in_the_first_wait(monkeypatch, flags)
    proc = subprocess.Popen([sys.executable, "-c", refused, str(run_dir), str(flags)])
    try:
        deadline = time.monotonic() + 30
        while not (flags / "holding").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the refused fit never took the lock"
            time.sleep(0.005)
        check_not_in_use(run_dir)  # the resume's early check: waits for it, as its lock would
        assert waits, "the early check found the folder free at once: the test proved nothing"
    finally:
        (flags / "release").touch()
        proc.wait(timeout=30)


def test_a_fit_whose_run_folder_goes_as_it_locks_it_makes_the_folder_again(tmp_path, monkeypatch):
    """A fit that fails before writing anything removes its run folder, lock file included (release_run_folders).
    A second fit that had made sure of the folder (mkdir) just before that, and opened its .lock just after, failed
    with "No such file or directory: .../.lock" instead of making the folder again and going on."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tinylm.cli.run_lock import lock_run_folder, release_run_folder

    run_dir, flags = tmp_path / "runs" / "x", tmp_path / "flags"
    flags.mkdir()
    first = ("import pathlib, sys, time\n"
             "from tinylm.cli.run_lock import lock_run_folder, release_run_folders\n"
             "flags = pathlib.Path(sys.argv[2]); lock_run_folder(pathlib.Path(sys.argv[1]))\n"
             "(flags / 'holds').touch()\n"
             "while not (flags / 'release').exists(): time.sleep(0.005)\n"
             "release_run_folders(failed=True); (flags / 'released').touch()\n")
    proc = subprocess.Popen([sys.executable, "-c", first, str(run_dir), str(flags)])

    def wait_for(name: str) -> None:
        deadline = time.monotonic() + 30
        while not (flags / name).exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"the first fit never got to {name!r}"
            time.sleep(0.005)

    real_mkdir = Path.mkdir

    def made_then_gone(self, *args, **kwargs):  # the barrier: the first fit lets go, its folder removed, just after
        real_mkdir(self, *args, **kwargs)  # the second made sure of it
        if self == run_dir and not (flags / "release").exists():
            (flags / "release").touch()
            wait_for("released")

    try:
        wait_for("holds")
        monkeypatch.setattr(Path, "mkdir", made_then_gone)
        lock_run_folder(run_dir)
        assert (run_dir / ".lock").read_text() == f"pid {os.getpid()}"  # the folder made again, and held
    finally:
        release_run_folder(run_dir)
        (flags / "release").touch()
        proc.wait(timeout=30)
    assert (flags / "released").exists()  # (the barrier was met: the folder went between the mkdir and the open)
