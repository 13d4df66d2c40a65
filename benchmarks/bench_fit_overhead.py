"""What `tinylm fit` does per optimizer step besides forward, backward and the optimizer: each callback's hooks,
the logging, the progress bar, the checkpoint cadence; their host time, and the host syncs and device kernels each
would cost on a GPU.

It runs the real `tinylm fit` in this process (the user's command and config, every callback on) with a Lightning
profiler that times every action Lightning profiles (each callback hook, each LightningModule hook, the batch fetch,
the training step, backward, the optimizer step) plus the loggers' writes and Lightning's own logging work, which
Lightning leaves unprofiled. Each hook's time is its own (the actions inside it are subtracted).

Runs twice per shape: first timed, then counted. The counted run runs under a torch dispatch mode that marks every
tensor the GPU would hold (parameters, the batch, and whatever is computed from them) and counts, per hook:
- *device ops*: ATen ops on such tensors, views left out: about the kernels the hook would launch on a GPU;
- *host syncs*: reads of such a tensor on the host (`.item()`, `float()`, `bool()`, `.tolist()`, `.cpu()`, `.numpy()`,
  data-dependent shapes such as `nonzero`), each of which waits on a GPU for every kernel queued before it, and
  Python numbers turned into device tensors (`self.log(name, 3.0)`: a blocking copy to the GPU).
`torch.cuda.synchronize`, which SpeedMonitor calls on a GPU's logging steps only, does not run on a CPU: it is added to
the table from the code (one per logging step).

    python benchmarks/bench_fit_overhead.py            # GPT-2 124M (micro-batch 1 x 128, eager) and the laptop recipe
    python benchmarks/bench_fit_overhead.py --shapes laptop --steps 30
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.profilers import Profiler
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
MODEL_WORK = ("[Strategy]SingleDeviceStrategy.training_step", "[Strategy]SingleDeviceStrategy.backward",
              "[LightningModule]TinyLM.optimizer_step", "[Strategy]SingleDeviceStrategy.batch_to_device")
CLIPPING = "[LightningModule]TinyLM.configure_gradient_clipping"
SHAPES = {  # name: (config, extra arguments): a small micro-batch of the shape, so that it runs on a CPU
    "124m": ("configs/gpt2-124m.yaml",
             ["--data.corpus", str(DATA / "tinyshakespeare.txt"), "--data.tokenizer",
              f"tiktoken:{DATA / 'gpt2.tiktoken'}", "--data.val_fraction", "0.1", "--data.batch_size", "1",
              "--data.block_size", "128", "--model.compile_model", "false", "--trainer.limit_val_batches", "0",
              "--data.num_workers", "0", "--run.wandb_project", "null"]),
    "laptop": ("configs/shakespeare-char-cpu.yaml", ["--data.corpus", str(DATA / "tinyshakespeare.txt")]),
}
_MARK = "_tinylm_on_device"
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
            "repeat_interleave", "equal", "is_nonzero"}


class Counts:
    """Per profiler action: device ops, host syncs and their kinds (the counted run only)."""

    def __init__(self) -> None:
        self.ops: collections.Counter[tuple[int, str]] = collections.Counter()
        self.syncs: collections.Counter[tuple[int, str]] = collections.Counter()
        self.kinds: collections.Counter[tuple[int, str, str]] = collections.Counter()


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def mark(t) -> None:
    if isinstance(t, torch.Tensor):
        setattr(t, _MARK, True)


class DeviceMarks(TorchDispatchMode):
    """Marks each op's outputs as device tensors when an input is one; counts device ops and host syncs."""

    def __init__(self, profiler: HookProfiler) -> None:
        super().__init__()
        self.profiler = profiler

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten((args, kwargs))
        if any(on_device(a) for a in flat):
            name = func.overloadpacket.__name__
            if name in SYNC_OPS:
                self.profiler.count_sync(name)
            elif not func.is_view and name not in ("detach", "alias", "lift_fresh"):
                self.profiler.count_op()
            for o in tree_flatten(out)[0]:
                mark(o)
        return out


class HookProfiler(Profiler):
    """Every profiled action's own time (children subtracted) per training batch; counts when `counts` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.batch = -1  # the training batch the actions belong to (a new one at each fetch)
        self.own: collections.defaultdict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
        self.batch_start: dict[int, float] = {}
        self._stack: list[list] = []  # [action, start, children's time]
        self.counts: Counts | None = None

    def start(self, action_name: str) -> None:
        if action_name == "[_TrainingEpochLoop].train_dataloader_next":
            self.batch += 1
            self.batch_start[self.batch] = time.perf_counter()
        self._stack.append([action_name, time.perf_counter(), 0.0])

    def stop(self, action_name: str) -> None:
        if not self._stack or self._stack[-1][0] != action_name:
            return
        name, t0, children = self._stack.pop()
        took = time.perf_counter() - t0
        self.own[name][self.batch] += took - children
        if self._stack:
            self._stack[-1][2] += took

    def current(self) -> str:
        return self._stack[-1][0] if self._stack else "(Lightning's loop, unprofiled)"

    def count_op(self) -> None:
        if self.counts is not None:
            self.counts.ops[(self.batch, self.current())] += 1

    def count_sync(self, kind: str) -> None:
        if self.counts is not None:
            self.counts.syncs[(self.batch, self.current())] += 1
            self.counts.kinds[(self.batch, self.current(), kind)] += 1

    def summary(self) -> str:
        return ""


@contextmanager
def profiled_internals(profiler: HookProfiler):
    """Profile what Lightning leaves unprofiled: its logger connector's per-batch work and the loggers' writes."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    targets = [(_LoggerConnector, "on_batch_end"), (_LoggerConnector, "update_train_step_metrics"),
               (CSVLogger, "log_metrics"), (CSVLogger, "save"), (WandbLogger, "log_metrics")]
    saved = [(cls, name, cls.__dict__.get(name)) for cls, name in targets]

    def wrap(cls, name, fn):
        def wrapper(*args, **kwargs):
            with profiler.profile(f"[{cls.__name__}].{name}"):
                return fn(*args, **kwargs)
        return wrapper

    for cls, name, _ in saved:
        setattr(cls, name, wrap(cls, name, getattr(cls, name)))
    try:
        yield
    finally:
        for cls, name, fn in saved:
            if fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, fn)


ACTIVE: list[HookProfiler] = []  # the run's profiler (jsonargparse builds it from its class path)


class CountedProfiler(HookProfiler):
    def __init__(self) -> None:
        super().__init__()
        ACTIVE[:] = [self]


class CountOnDevice(L.Callback):
    """Added by --trainer.callbacks+=: marks the parameters and each batch as device tensors, and counts under
    `DeviceMarks` and `host_reads` from the start of training to its end."""

    def __init__(self) -> None:
        self.mode: DeviceMarks | None = None
        self.patches = None

    def on_train_start(self, trainer, pl_module) -> None:
        profiler = ACTIVE[0]
        profiler.counts = Counts()
        for p in pl_module.parameters():
            mark(p)
        self.patches = host_reads(profiler)
        self.patches.__enter__()
        self.mode = DeviceMarks(profiler)
        self.mode.__enter__()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        for t in tree_flatten(batch)[0]:
            mark(t)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.patches.__exit__(None, None, None)
            self.mode = None


@contextmanager
def host_reads(profiler: HookProfiler):
    """Count the host reads that no ATen op shows on a CPU (`.cpu()` of a CPU tensor returns it as is), and Python
    numbers that Lightning turns into device tensors. The copy `.cpu()` returns is a host tensor: reading it is free."""
    saved = {name: getattr(torch.Tensor, name) for name in ("cpu", "tolist", "numpy", "to")}
    to_tensor = L.LightningModule._LightningModule__to_tensor

    def reader(name):
        fn = saved[name]

        def read(self, *args, **kwargs):
            # `.to(device)` with a torch.device is the module's device (clip_grad_norm_ moves norms so): only the
            # string "cpu" says the host
            host = name != "to" or "cpu" in (*args, kwargs.get("device"))
            if not (host and on_device(self)):
                return fn(self, *args, **kwargs)
            profiler.count_sync(f".{name}()")
            out = fn(self, *args, **kwargs)
            if isinstance(out, torch.Tensor):
                out = out.clone()  # (a new object, left unmarked)
                setattr(out, _MARK, False)
            return out
        return read

    def python_to_device(self, value, name):
        if not isinstance(value, torch.Tensor):
            profiler.count_sync("self.log(python number)")
        return to_tensor(self, value, name)

    for name in saved:
        setattr(torch.Tensor, name, reader(name))
    L.LightningModule._LightningModule__to_tensor = python_to_device
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        L.LightningModule._LightningModule__to_tensor = to_tensor


def run_fit(shape: str, steps: int, accumulate: int, count: bool, work: Path) -> HookProfiler:
    import os

    from tinylm.cli.fit import lightning_main

    config, extra = SHAPES[shape]
    args = ["fit", "--config", str(REPO / config), *extra, "--trainer.max_steps", str(steps),
            "--trainer.accumulate_grad_batches", str(accumulate),
            "--run.name", f"{shape}-{'count' if count else 'time'}",
            "--trainer.profiler", '{"class_path": "bench_fit_overhead.CountedProfiler"}']
    if count:
        args.append("--trainer.callbacks+=bench_fit_overhead.CountOnDevice")
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with profiled_internals_active():
            cli = lightning_main(args)
    finally:
        os.chdir(cwd)
    return cli.trainer.profiler


@contextmanager
def profiled_internals_active():
    class Late:  # the profiler is built inside lightning_main: the wrappers look it up when called
        def profile(self, name):
            return ACTIVE[0].profile(name) if ACTIVE else contextmanager(lambda: (yield))()

    with profiled_internals(Late()):
        yield


def owner(action: str) -> str:
    if action in MODEL_WORK:
        return "model work (forward, backward, optimizer)"
    if action == CLIPPING:
        return "model work: clip_grad_norm_ (nanoGPT clips too) + logging train/grad_norm"
    name = action.split("{")[0]
    if name.startswith("[Callback]"):
        name = name[len("[Callback]"):].split(".")[0]
        return name.replace("tinylm.train.", "").split(".")[-1]
    return name


def step_walls(prof: HookProfiler, accumulate: int) -> dict[int, float]:
    """Wall time of each optimizer step that has a next one (fetch of its first batch to the next step's)."""
    starts = prof.batch_start
    return {b // accumulate: starts[b + accumulate] - starts[b] for b in starts
            if b % accumulate == 0 and b + accumulate in starts}


def table(timed: HookProfiler, counted: HookProfiler, accumulate: int, warmup: int) -> tuple[list[dict], float]:
    """Rows per owner (callback, hook, loop): ms per optimizer step (mean over the steady steps: the first `warmup`
    and the last left out), device ops and host syncs per step; and the median step time in ms."""
    walls = {s: w for s, w in step_walls(timed, accumulate).items() if s >= warmup}
    steps = sorted(walls)
    rows: dict[str, dict] = collections.defaultdict(lambda: {"ms": 0.0, "ops": 0.0, "syncs": 0.0, "hooks": set()})
    profiled = collections.Counter()
    for action, per_batch in timed.own.items():
        for b, seconds in per_batch.items():
            if b // accumulate in walls:
                rows[owner(action)]["ms"] += seconds * 1e3 / len(steps)
                if seconds > 1e-5:
                    rows[owner(action)]["hooks"].add(action.rsplit(".", 1)[-1])
                profiled[b // accumulate] += seconds
    loop = "(Lightning's loop, unprofiled)"
    rows[loop]["ms"] = statistics.fmean(walls[s] - profiled[s] for s in steps) * 1e3
    c = counted.counts
    counted_steps = {b // accumulate for b, _ in c.ops} | {b // accumulate for b, _ in c.syncs}
    n = max(len([s for s in counted_steps if s in walls]), 1)
    for field, counter in (("ops", c.ops), ("syncs", c.syncs)):
        for (b, action), k in counter.items():
            if b // accumulate in walls:
                rows[owner(action) if action != loop else loop][field] += k / n
    out = [{"owner": k, **v, "hooks": sorted(v["hooks"])} for k, v in rows.items()]
    return sorted(out, key=lambda r: -r["ms"]), statistics.fmean(walls.values()) * 1e3


def report(shape: str, rows: list[dict], step_ms: float, accumulate: int, kinds: collections.Counter,
           gpu: bool) -> str:
    gpu_step = 35.0 * accumulate  # GPT-2 124M at 16 x 1024 on an H100: ~35 ms per micro-batch (issue 34)
    lines = [f"### {shape}: accumulation {accumulate}, a step {step_ms:.1f} ms on this CPU (median)", "",
             "| what | host ms / step | % of this CPU step | % of a 124M GPU step | device ops / step | "
             "host syncs / step | hooks |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        work = r["owner"].startswith("model work")
        flag = " **>2%**" if gpu and not work and r["ms"] / gpu_step > 0.02 else ""
        on_gpu = "" if work or not gpu else format(r["ms"] / gpu_step, ".1%")
        lines.append(f"| {r['owner']} | {r['ms']:.2f} | {r['ms'] / step_ms:.1%} | "
                     f"{on_gpu}{flag} | {r['ops']:.0f} | {r['syncs']:.2f} | "
                     f"{', '.join(r['hooks'])[:90]} |")
    overhead = sum(r["ms"] for r in rows if not r["owner"].startswith("model work"))
    lines += ["", f"Everything but the model's work: {overhead:.1f} ms per step, {overhead / step_ms:.1%} of this "
              "CPU's step" + (f"; against a GPU step of {gpu_step:.0f} ms (35 ms per micro-batch x {accumulate}): "
                              f"{overhead / gpu_step:.1%}" if gpu else "") + ". On a GPU, `SpeedMonitor` adds 1 "
              "`torch.cuda.synchronize` per logging step (not run on a CPU)."]
    if kinds:
        lines += ["", "Host syncs by kind and hook, over the steady steps: " + "; ".join(
            f"{k} in {where}: {n}" for (where, k), n in kinds.most_common())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="124m,laptop", help="comma-separated: 124m, laptop")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (124m: 8, laptop: 40)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out")
    parser.add_argument("--out", type=Path, default=None, help="a file for the markdown tables")
    args = parser.parse_args()
    sys.modules.setdefault("bench_fit_overhead", sys.modules[__name__])  # one module for jsonargparse's class paths
    from bench_train_step import machine_line, quiet_lightning

    quiet_lightning()
    text = [machine_line(), ""]
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            steps = args.steps or {"124m": 8, "laptop": 40}[shape]
            accumulate = {"124m": 2, "laptop": 1}[shape]
            timed = run_fit(shape, steps, accumulate, False, Path(tmp))
            counted = run_fit(shape, steps, accumulate, True, Path(tmp))
            rows, step_ms = table(timed, counted, accumulate, args.warmup)
            steady = {s for s in step_walls(timed, accumulate) if s >= args.warmup}
            kinds = collections.Counter()
            for (b, where, kind), n in counted.counts.kinds.items():
                if b // accumulate in steady:
                    kinds[(where.split("{")[0], kind)] += n
            text.append(report(shape, rows, step_ms, accumulate, kinds, gpu=shape == "124m"))
            print(text[-1], flush=True)
    if args.out:
        args.out.write_text("\n\n".join(text) + "\n")


if __name__ == "__main__":
    main()
