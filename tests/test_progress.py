"""tinylm.progress: a bar on a terminal, plain lines in a log (a file, a pipe), nothing under TQDM_DISABLE."""

import io
import os
import types

import pytest

from tinylm import progress


@pytest.fixture
def clock(monkeypatch):
    """tinylm.progress's clock, set by hand: [seconds]."""
    now = [0.0]
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_a_bar_on_a_terminal_does_not_follow_the_wall_clocks_steps(clock, monkeypatch):
    """Catches prepare's, eval's and generate's bars on a terminal timed by tqdm's wall clock (time.time): a clock
    stepped back an hour mid-loop (NTP, a VM restored from a snapshot) drew "50/100 [-59:55<...]"."""
    import tqdm.std

    wall = [1.8e9]
    monkeypatch.setattr(tqdm.std, "time", lambda: wall[0])  # (what a tqdm made now reads)
    monkeypatch.setattr(progress, "draws_bars", lambda stream: True)  # (a terminal)
    made = progress.bar(total=100, file=io.StringIO())
    try:
        wall[0] -= 3600
        clock[0] += 5
        made.n = 50
        assert made.format_dict["elapsed"] == 5, str(made)
    finally:
        made.close()


def test_a_loop_in_a_log_writes_a_line_every_so_often_and_none_when_short(clock):
    """Catches a bar's redrawings (carriage returns, several a second) written into a log of prepare, eval or
    sample-report, and the other way round, a line for every loop of a second: a line every LINE_INTERVAL
    seconds, a last one at the end when any was written, none for a loop that ends sooner."""
    log = io.StringIO()
    with progress.bar(total=100_000, desc="tokenizing x", unit="B", unit_scale=True, file=log) as bar:
        assert isinstance(bar, progress.Lines)
        for t in (10.0, 31.0, 40.0):
            clock[0] = t
            bar.update(10_000 if t < 40 else 80_000)
    lines = log.getvalue().splitlines()
    assert lines == ["tokenizing x:  20% 20.0k/100k [00:31<02:04, 645B/s]",
                     "tokenizing x: 100% 100k/100k [00:40<00:00, 2.50kB/s]"], lines
    short = io.StringIO()
    for _ in progress.bar(range(5), desc="quick", file=short):
        clock[0] += 1
    assert short.getvalue() == ""  # its caller says what it did


def test_a_line_short_of_the_end_does_not_say_100_percent(clock):
    """Catches a log's progress line "steps: 100% 590/592" (tqdm's share rounded: 99.66 %) written before the last
    steps, read as the run's end: the share is rounded down, 100% only at the end."""
    log = io.StringIO()
    with progress.bar(total=592, desc="steps", file=log) as bar:
        clock[0] = 31.0
        bar.update(590)
        clock[0] = 62.0
        bar.update(2)
    lines = log.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["steps:  99% 590/592", "steps: 100% 592/592"], lines


def test_a_terminal_gets_tqdm_and_tqdm_disable_silences_both(monkeypatch):
    """Catches the bar on a terminal replaced by lines, and TQDM_DISABLE (tqdm's own switch) ignored: tinylm passed
    `disable=` to tqdm, which overrides the variable."""
    import fcntl
    import struct
    import termios

    from tqdm.std import tqdm

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # (tqdm draws nothing on 0 x 0)
    with open(slave, "w") as term:
        on_terminal = progress.bar(total=3, desc="x", file=term)
        assert isinstance(on_terminal, tqdm) and not on_terminal.disable
        on_terminal.close()
        monkeypatch.setenv("TQDM_DISABLE", "1")
        assert progress.bar(total=3, file=term).disable
        assert progress.bar(total=3, file=io.StringIO()).disable
        monkeypatch.setenv("TQDM_DISABLE", "0")
        assert isinstance(progress.bar(total=3, file=io.StringIO()), progress.Lines)
    os.close(master)


def test_bpe_training_writes_no_redrawn_bar_to_a_log(capsys, monkeypatch):
    """Catches the from-scratch BPE's bar over its merges written to stderr as carriage-return frames when stderr is
    a file (pytest's capture is one): the library's bars go through tinylm.progress."""
    from tinylm.tokenize.bpe import ByteLevelBPE

    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)  # a line at every merge: the lines are seen
    ByteLevelBPE.train("aaabdaaabac", vocab_size=259, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[-1].startswith("bpe merges: 100% 3/3 ["), err


def test_a_long_step_with_no_progress_of_its_own_beats_in_a_log(capsys):
    """Catches a BPE trainer's minutes of merging (after the text is read) leaving a log silent: a heartbeat line
    every interval while the step runs, once it has something to say, and none after it ended."""
    import time

    told = []

    def say(seconds: float) -> str | None:
        told.append(seconds)
        return None if len(told) < 2 else f"merging, {len(told)}"

    with progress.heartbeat(say, interval=0.01):
        while len(told) < 4:
            time.sleep(0.01)
    after = len(told)
    time.sleep(0.05)
    err = capsys.readouterr().err.splitlines()
    assert err[:3] == ["merging, 2", "merging, 3", "merging, 4"] and len(told) == after
    assert told == sorted(told)


def test_tqdm_disable_0_leaves_the_bar_on_a_terminal():
    """Catches TQDM_DISABLE=0 (set as the process starts) turning the bar off: tqdm reads its variables once, at its
    import, as bool("0"), which is True; tinylm's own reading (`disabled_by_env`) says the bar is on."""
    import subprocess
    import sys

    code = ("import os\nfrom tinylm import progress\nm, s = os.openpty()\nwith open(s, 'w') as term:\n"
            "    print(progress.bar(total=3, file=term).disable)\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TQDM_DISABLE": "0"}, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_a_terminal_of_no_size_gets_lines():
    """Catches a run showing no progress at all on a pty nobody sized (`script -c` or `docker run -t` in CI: 0 columns,
    0 rows): tqdm draws nothing there, so the bar must be lines, as in a log; a sized terminal keeps its bar."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as tty:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        assert not progress.draws_bars(tty)
        assert isinstance(progress.bar(total=3, file=tty), progress.Lines)
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        assert progress.draws_bars(tty)
    os.close(leader)


def test_a_stop_and_continue_is_left_out_of_a_lines_rate_and_time_left(clock):
    """Catches a log's progress lines counting the time a run was stopped (Ctrl+Z then fg, kill -STOP/-CONT, SLURM's
    suspend) as work: a 20 s stop of a 500-step run at step 200 (8 s to go) said 37 s left, and the overstatement
    shrank only as the average since the start caught up."""
    import signal

    log = io.StringIO()
    bar = progress.Lines(total=500, desc="steps", file=log, interval=None)
    try:
        for step in (100, 200):
            clock[0] += 2.0  # 50 steps a second
            bar.n = step
            bar.emit()
        clock[0] += 60.0  # stopped for a minute in the next interval, continued (SIGCONT)
        os.kill(os.getpid(), signal.SIGCONT)
        clock[0] += 1.0
        bar.n = 250
        bar.emit()
        clock[0] += 1.0
        bar.n = 300
        bar.emit()
    finally:
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
    lines = log.getvalue().splitlines()
    assert lines[-1] == "steps:  60% 300/500 [01:06<00:04, 50.00it/s]", lines  # the elapsed time is the wall's
