"""`tinylm plan`'s memory estimate against measured peak memory of a training step on CPU, and what activation
checkpointing saves and costs.

    python benchmarks/bench_memory.py            # all configs; one fresh process per measurement
    python benchmarks/bench_memory.py --configs 0,2 --no-times   # the first and third configs, memory only

How it is measured: the step is TinyLM's own loss + backward + clip + optimizer step + zero_grad(set_to_none=True),
in the order tinylm's module runs them under Lightning (it frees the gradients right after the step; autocast
around the forward only under bf16-mixed), with tinylm's optimizer (`build_optimizer`: fused AdamW where torch has
it, Muon + AdamW for the modern recipe), after two warm-up steps so the optimizer states exist.
- tensor peak: the torch profiler's memory timeline (profile_memory, record_shapes, with_stack) of the third step:
  the most bytes of live tensors at any moment, by category. This is what the allocator hands out (what a GPU's
  `max_memory_allocated` reports), independent of malloc's caching.
- RSS delta: in another fresh process without the profiler, peak RSS (getrusage ru_maxrss) after three steps minus
  the RSS just before the model is built: what the OS sees, allocator caching and fragmentation included.
- step time: checkpointing off/on, interleaved in one process (median of blocks), the same weights and batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

CONFIGS = {  # name: (TinyLM kwargs, batch_size, precision)
    "laptop recipe (char, 4x128, T=64, B=12)": ({"vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4,
                                                       "n_embd": 128, "bias": False}, 12, "32-true"),
    "char 6x384, T=256, B=8, bf16-mixed": ({"vocab_size": 65, "block_size": 256, "n_layer": 6, "n_head": 6,
                                          "n_embd": 384}, 8, "bf16-mixed"),
    "GPT-2 vocab 4x256, T=256, B=4": ({"vocab_size": 50257, "block_size": 256, "n_layer": 4, "n_head": 4,
                                      "n_embd": 256}, 4, "32-true"),
    "modern laptop recipe (RoPE, RMSNorm, qk_norm, relu2, softcap, Muon; 4x128, T=64, B=12)": (
        {"vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "bias": False,
         "positions": "rope", "norm": "rmsnorm", "qk_norm": True, "mlp": "relu2", "tie_embeddings": False,
         "logit_softcap": 15.0, "zero_init_proj": True, "optimizer": "muon"}, 12, "32-true"),
    "SwiGLU 6x384, T=256, B=8, bf16-mixed": ({"vocab_size": 65, "block_size": 256, "n_layer": 6, "n_head": 6,
                                              "n_embd": 384, "mlp": "swiglu"}, 8, "bf16-mixed"),
}


def _setup(name: str, ckpt: bool, device: str = "cpu"):
    """(module, batch size, precision, one training step) of CONFIGS[name] on ``device`` (benchmarks/gpu/
    plan_memory.py runs the same step on a GPU)."""
    from tinylm.train.module import TinyLM
    from tinylm.train.optim import build_optimizer, fused_adamw

    kwargs, batch, precision = CONFIGS[name]
    torch.manual_seed(0)
    module = TinyLM(**kwargs, activation_checkpointing=ckpt).to(device)
    hp = module.hparams
    opt = build_optimizer(module.model, optimizer=hp.optimizer, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95),
                          muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0, fused=fused_adamw(module.device))
    x = torch.randint(0, kwargs["vocab_size"], (batch, kwargs["block_size"]), device=device)
    y = torch.randint(0, kwargs["vocab_size"], (batch, kwargs["block_size"]), device=device)
    mixed = precision == "bf16-mixed"

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=mixed):
            loss = module._loss((x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return module, batch, precision, step


def measure_tensors(name: str, ckpt: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import (
        MemoryProfileTimeline,  # private; a benchmark may lean on it
    )

    _, _, _, step = _setup(name, ckpt)
    step(), step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as p:
        step()
    _, sizes = MemoryProfileTimeline(p._memory_profile())._coalesce_timeline(torch.device("cpu"))
    return {"tensor_peak": max(sum(s) for s in sizes)}


def measure_rss(name: str, ckpt: bool) -> dict:
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    kwargs, _batch, precision = CONFIGS[name]
    CONFIGS["warm-up"] = (dict(kwargs, n_layer=1, n_embd=32, n_head=1), 1, precision)
    warm = _setup("warm-up", ckpt)[3]
    warm(), warm()  # the runtime's one-time costs (thread pools, kernel caches: ~190 MB) are not the model's
    del warm
    gc.collect()
    before = rss()
    _, _, _, step = _setup(name, ckpt)
    for _ in range(3):
        step()
    return {"rss_delta": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before}


def step_times(name: str, blocks: int = 7, per_block: int = 2) -> dict:
    """Median wall and CPU seconds per step, checkpointing off and on, in alternating blocks."""
    runs = {ckpt: _setup(name, ckpt)[3] for ckpt in (False, True)}
    for step in runs.values():
        step()
    times = {(ckpt, clock): [] for ckpt in runs for clock in ("wall", "cpu")}
    for _ in range(blocks):
        for ckpt, step in runs.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(per_block):
                step()
            times[ckpt, "wall"].append((time.perf_counter() - t) / per_block)
            times[ckpt, "cpu"].append((time.process_time() - c) / per_block)
    return {f"{clock}_{'on' if ckpt else 'off'}": statistics.median(v) for (ckpt, clock), v in times.items()}


def estimate(name: str, ckpt: bool) -> dict:
    from tinylm.studies.plan import memory

    module, batch, precision, _ = _setup(name, ckpt)
    return vars(memory(module.model, batch_size=batch, precision=precision, checkpointing=ckpt,
                       optimizer=module.hparams.optimizer))


def _in_fresh_process(fn: str, name: str, ckpt: bool) -> dict:
    code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_memory as b; " \
           f"print(json.dumps(b.{fn}({name!r}, {ckpt})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(map(str, range(len(CONFIGS)))),
                        help="comma-separated indices into: " + "; ".join(f"{i} {n}" for i, n in enumerate(CONFIGS)))
    parser.add_argument("--no-times", action="store_true", help="skip the step-time comparison")
    args = parser.parse_args()
    try:
        names = [list(CONFIGS)[int(i)] for i in args.configs.split(",")]
    except (ValueError, IndexError):
        parser.error(f"--configs {args.configs!r}: expected comma-separated indices from 0 to {len(CONFIGS) - 1}")
    mb = 1e6
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| config | act. ckpt | estimate (MB) | tensor peak (MB) | est./tensor | RSS delta (MB) | est./RSS |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        for ckpt in (False, True):
            est = estimate(name, ckpt)["peak"]
            peak = _in_fresh_process("measure_tensors", name, ckpt)["tensor_peak"]
            delta = _in_fresh_process("measure_rss", name, ckpt)["rss_delta"]
            print(f"| {name} | {'on' if ckpt else 'off'} | {est / mb:.1f} | {peak / mb:.1f} | {est / peak:.3f} | "
                  f"{delta / mb:.1f} | {est / delta:.3f} |", flush=True)
    if args.no_times:
        return
    print("\n| config | step, ckpt off (s) | step, ckpt on (s) | wall ratio | CPU-time ratio |")
    print("|---|---:|---:|---:|---:|")
    for name in names[:2]:
        t = step_times(name)
        print(f"| {name} | {t['wall_off']:.3f} | {t['wall_on']:.3f} | {t['wall_on'] / t['wall_off']:.2f} | "
              f"{t['cpu_on'] / t['cpu_off']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
