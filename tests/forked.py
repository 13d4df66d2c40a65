"""`python -m tinylm ...` as a process forked from a server that has already imported tinylm, torch and Lightning.

A fresh interpreter spends ~7-9 s importing Lightning (and ~2 s collecting its garbage as it exits) before the run
that a test is about starts. Tests of a run's behaviour (its signals, its exit status, what it says, its ranks) start
it here instead: a child forked from the server runs the command as `python -m tinylm` does (runpy, with sys.argv,
the working directory, the environment, stdin/stdout/stderr and the session of a fresh process), ends through the
interpreter's own exit (atexit hooks, an uncaught KeyboardInterrupt re-sent as SIGINT) and is handled like a
subprocess.Popen. Processes the run starts itself are as they would be (loader workers, ddp_fork's ranks forked from
the run, DDP's ranks 2.. fresh `python -m tinylm.__main__ ...` processes), but for DDP's rank 1: forked from the run
before the run starts, it runs the command DDP's launcher gives it as a fresh one would (see _RANKS); a test of how a
rank's interpreter starts (its imports, its warnings at import) starts its command with subprocess.

The server imports modules only (no thread, no run: each child starts from the same untouched state), then freezes
the garbage collector's view of them (gc.freeze, as Python's docs advise before fork). One server per test process
(pytest-xdist worker), started on first use; it serves one child at a time.
"""

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PIPE = subprocess.PIPE  # stdout/stderr read by Forked.communicate: to their end, when every process holding them ended

_SERVER = r"""
import gc, json, os, signal, sys
said = os.fdopen(os.dup(1), "w")  # the lines the tests read; anything else written to stdout goes nowhere
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
import torch, torch.distributed, lightning.pytorch, lightning.pytorch.cli, jsonargparse  # what every run imports
import tinylm.cli, tinylm.cli.fit, tinylm.cli.commands, tinylm.cli.scaling, tinylm.data, tinylm.model, tinylm.train
import runpy
from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only


def as_started(env):
    # What torch reads from the environment as it is imported, read again from ``env``: the level of its C++ log
    # (TORCH_CPP_LOG_LEVEL: rank 0 sets ERROR for the ranks it starts; each said a gloo warning with its C++ stack
    # otherwise) and its threads (OMP_NUM_THREADS). (Lightning's rank, read from RANK/LOCAL_RANK as Lightning is
    # imported, is the server's 0 for a command, as a fresh one's is after tinylm dropped a stray RANK before that
    # import; a test of that drop starts a fresh process.)
    import ctypes

    level = env.get("TORCH_CPP_LOG_LEVEL", "").upper()
    levels = {"0": 0, "INFO": 0, "1": 1, "WARNING": 1, "2": 2, "ERROR": 2, "3": 3, "FATAL": 3}
    if level in levels:
        c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        ctypes.c_int.in_dll(c10, "FLAGS_caffe2_log_level").value = levels[level]
    if env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


gc.freeze()
module = "tinylm"
print("ready", file=said, flush=True)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        break
    print("pid", child, file=said, flush=True)
    status = os.waitpid(child, 0)[1]
    print("exit", os.waitstatus_to_exitcode(status), file=said, flush=True)
else:
    sys.exit(0)
# the child: set up as a fresh `python -m tinylm ARGS` started by subprocess.Popen would be
said.close()
if request["session"]:
    os.setsid()
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
for fd, path in ((0, request["stdin"]), (1, request["stdout"]), (2, request["stderr"])):  # a terminal among them:
    # opened by the leader of a new session, it becomes the session's controlling terminal, as under a login shell
    opened = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(opened, fd)
    os.close(opened)
sys.path[1:1] = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
if request["ignore_sigint"]:  # started with Ctrl+C ignored (a script's `&` job): Python then installs no handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)
# the ranks DDP's launcher starts as fresh `python -m tinylm.__main__ ...` processes: the first forked now, from this
# untouched state
exec(compile(RANKS, "tests/forked.py:_RANKS", "exec"))
as_started(request["env"])
sys.argv = ["tinylm", *request["args"]]
del said, request, line, child, fd, path, opened
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

# DDP's launcher (Lightning's _SubprocessScriptLauncher, in the run) starts ranks 1.. with subprocess.Popen as fresh
# `python -m tinylm.__main__ ARGS` processes, each importing Lightning again (~8-10 s of CPU on this machine). Rank 1
# is forked here instead, from the run's process before the run starts (the state a fresh interpreter has after its
# imports): it waits, its signals ignored, for the command and environment the launcher gives subprocess.Popen, then
# runs it as `python -m` would, a child of the run as the launcher's would be (its watch of rank 0 reads its parent).
# Ranks 2.. and any other process the run starts are subprocess.Popen's own. /proc/PID/comm names it "tinylm-rank1"
# (its /proc/PID/environ is the server's, without LOCAL_RANK).
_RANKS = r"""
import subprocess
wait_r, wait_w = os.pipe()
started_r, started_w = os.pipe()
rank = os.fork()
if rank == 0:
    os.close(wait_w)
    os.close(started_r)
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    for s in kept:  # a signal to the run's group before the launcher asked for it: a fresh rank 1 did not exist yet
        signal.signal(s, signal.SIG_IGN)
    asked = b""
    while not asked.endswith(b"\n"):
        if not (got := os.read(wait_r, 65536)):  # the run ended without asking for it (one device, an error)
            os._exit(0)
        asked += got
    os.close(wait_r)
    asked = json.loads(asked)
    for s, handler in kept.items():
        signal.signal(s, handler)
    with open("/proc/self/comm", "w") as comm:
        comm.write("tinylm-rank1")
    os.write(started_w, b"x")  # named: the launcher's subprocess.Popen returns (a fresh one's exec had happened)
    os.close(started_w)
    if asked["cwd"] is not None:
        os.chdir(asked["cwd"])
    os.environ.clear()
    os.environ.update(asked["env"])
    request["args"], request["env"], module = asked["args"], asked["env"], asked["module"]  # (as_started reads env)
    rank_zero_only.rank = _get_rank() or 0  # Lightning's import in a fresh rank reads LOCAL_RANK=1
    del kept, s, handler, got, asked, comm
else:
    os.close(wait_r)
    os.close(started_w)

    class _Launch(subprocess.Popen):
        def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest):
            global rank
            redirected = rest[3:9] != (-1,) * 6  # p2cread .. errwrite: the launcher redirects none
            if rank is None or redirected or executable is not None or not isinstance(args, list) or \
                    args[:2] != [sys.executable, "-m"] or env is None or env.get("LOCAL_RANK") != "1":
                return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)
            os.write(wait_w, (json.dumps({"module": args[2], "args": args[3:], "env": dict(env),
                                          "cwd": None if cwd is None else os.fspath(cwd)}) + "\n").encode())
            os.close(wait_w)
            os.read(started_r, 1)
            os.close(started_r)
            self.pid, self._child_created, rank = rank, True, None

    subprocess.Popen = _Launch
"""


class _Server:
    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="tinylm-fork-server-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-c", f"RANKS = {_RANKS!r}\n{_SERVER}"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log,
                                     start_new_session=True)  # a test's Ctrl+C to its own group does not reach it
        self.buffer = b""
        self.current: Forked | None = None
        assert self.readline(300) == "ready", self.said()

    def said(self) -> str:
        return "the fork server failed:\n" + Path(self.log.name).read_text()[-3000:]

    def readline(self, timeout: float | None) -> str | None:
        """The server's next line; None if none comes within ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            data = os.read(fd, 4096)
            if not data:
                raise RuntimeError(self.said())
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def start(self, args, cwd, env, stdin, stdout, stderr, session: bool, ignore_sigint: bool) -> "Forked":
        if self.current is not None and self.current.poll() is None:  # left running by a failed test: not for long
            self.current.end()
        pipes, folder = {}, None
        for name, where in (("stdout", stdout), ("stderr", stderr)):
            if where is PIPE:  # a FIFO, opened here before the child opens it: its read end, and a write end that
                # keeps it from reading as ended before the child has opened it (closed once the child ended)
                folder = folder or tempfile.mkdtemp(prefix="tinylm-fork-")
                fifo = os.path.join(folder, name)
                os.mkfifo(fifo)
                pipes[name] = (os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                stdout, stderr = (fifo, stderr) if name == "stdout" else (stdout, fifo)
        request = {"args": [str(a) for a in args], "cwd": str(cwd), "env": dict(os.environ if env is None else env),
                   "stdin": str(stdin), "stdout": str(stdout), "stderr": str(stderr), "session": session,
                   "ignore_sigint": ignore_sigint}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        said, pid = self.readline(60).split()
        assert said == "pid", said
        self.current = Forked(self, int(pid), session, ["tinylm", *args], pipes, folder)
        return self.current

    def close(self) -> None:
        if self.current is not None and self.current.poll() is None:
            self.current.end()
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log.name)


class Forked:
    """The forked run, as subprocess.Popen has it: pid, poll, wait, returncode (-N when signal N ended it),
    send_signal, kill."""

    def __init__(self, server: _Server, pid: int, session: bool, args: list[str], pipes: dict | None = None,
                 folder: str | None = None) -> None:
        self.server, self.pid, self.session, self.args = server, pid, session, args
        self.returncode: int | None = None
        self.pipes = pipes or {}  # "stdout"/"stderr": (read end, this process's write end) of its FIFO in folder
        self.folder = folder

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self.server.readline(timeout)
            if line is not None:
                said, code = line.split()
                assert said == "exit", said
                self.returncode = int(code)
        return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._collect(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for it to end and read its PIPE streams to their end (EOF once every process that inherited them,
        its ranks and workers too, closed them), as subprocess.Popen.communicate; text ("" for a stream not PIPE)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        got = {name: b"" for name in self.pipes}
        open_ = dict(self.pipes)
        while self.poll() is None or open_:
            if self.returncode is not None:
                for name, (_, keep) in list(open_.items()):  # it ended: only its descendants may still write
                    if keep is not None:
                        os.close(keep)
                        open_[name] = (open_[name][0], None)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            wait = 0.2 if left is None else min(0.2, left)
            for fd in select.select([fd for fd, _ in open_.values()], [], [], wait)[0] if open_ else ():
                name = next(n for n, (f, _) in open_.items() if f == fd)
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if data:
                    got[name] += data
                elif open_[name][1] is None:  # EOF, and not for want of a writer yet: ours was open until the end
                    os.close(fd)
                    del open_[name]
            if not open_ and self.returncode is None:
                self._collect(left)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        return tuple(got.get(name, b"").decode(errors="replace") for name in ("stdout", "stderr"))

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def end(self) -> None:
        """SIGKILL it (its whole session, when it has one: loader workers, ranks) and wait for it."""
        if self.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL) if self.session else os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait()
        for fds in self.pipes.values():
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


_server: _Server | None = None


def popen(args, *, cwd, env=None, stdin=os.devnull, stdout=os.devnull, stderr=os.devnull,
          start_new_session: bool = False, ignore_sigint: bool = False) -> Forked:
    """`python -m tinylm ARGS` forked from the server, as subprocess.Popen would start it; ``stdin`` is a path (read),
    ``stdout`` and ``stderr`` paths (appended to) or PIPE (read by communicate), ``env`` the whole environment
    (default: this process's). A terminal's path (``os.ttyname`` of a pty's end) for them all, with
    ``start_new_session``, starts it as a login shell's job: its own session, that terminal its controlling one."""
    global _server
    if _server is None:
        _server = _Server()
        atexit.register(_server.close)
    return _server.start(args, cwd, env, stdin, stdout, stderr, start_new_session, ignore_sigint)


def run(args, *, cwd, env=None, timeout: float, start_new_session: bool = False) -> subprocess.CompletedProcess:
    """`python -m tinylm ARGS` forked from the server, as subprocess.run(..., capture_output=True, text=True,
    check=False) runs it: its stdout and stderr read to their end (every process that held them ended); a run past
    ``timeout`` s is killed and raises subprocess.TimeoutExpired."""
    proc = popen(args, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE, start_new_session=start_new_session)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.end()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def reap(pid: int, timeout: float = 120) -> int:
    """The wait status of a child the test forked from its own process itself (os.fork), as ``os.waitpid(pid, 0)``
    gives it; one still running after ``timeout`` s is SIGKILLed, reaped, and fails the test, and so is one whose
    test is interrupted meanwhile (Ctrl+C). A child deadlocked after the fork (an OpenMP pool, a lock
    another thread held) hung os.waitpid, and with it the whole suite, for good; killed, it holds no copy of the
    test worker's pipes either."""
    deadline = time.monotonic() + timeout
    try:
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"the child forked by this test (pid {pid}) still ran after {timeout:.0f} s: "
                                     "killed")
            time.sleep(0.01)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise
    return done[1]


def two_ranks(work, folder: Path, timeout: float = 120) -> list[str]:
    """What ``work(rank, port)`` returned in each of 2 ranks: children the test forks from its own process (torch and
    tinylm imported once), rank 0 and rank 1, given a free port of this machine for their process group; each one's
    text (or traceback) is written into ``folder``; the test fails with both where a rank did not end with 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    children = {}
    for rank in (0, 1):
        child = os.fork()
        if child == 0:  # pragma: no cover (a rank: leaves at once)
            code = 1
            try:
                (folder / f"rank-{rank}.txt").write_text(work(rank, port))
                code = 0
            except BaseException:
                import traceback

                (folder / f"rank-{rank}.txt").write_text(traceback.format_exc())
            finally:
                os._exit(code)
        children[rank] = child
    codes = [os.waitstatus_to_exitcode(reap(children[rank], timeout)) for rank in (0, 1)]
    said = [(folder / f"rank-{rank}.txt").read_text() for rank in (0, 1)]
    assert codes == [0, 0], said
    return said
