"""Torch's CPU thread count on a busy machine: tinylm's choice (`tinylm.device.choose_cpu_threads`) vs 1 and 2 threads.

A bare training step of the laptop recipe's model (configs/shakespeare-char-cpu.yaml: 4 layers, 128 wide, 12 x 64
tokens, AdamW) timed with 1 thread, with torch's default, and with tinylm's choice, interleaved in blocks
(1, default, choice, 1, default, ...) so other jobs' load hits each alike; medians per step. Three scenes:
`quiet` (whatever the machine runs now), `half` (one busy-loop process per two usable CPUs) and `loaded` (one
busy-loop process per usable CPU, so the load is about the cores), each plus what other jobs add. tinylm's choice
is made at the start of each scene, as a run makes it at its start. The load average is printed beside each scene.
`--work generate` times what `tinylm generate` does on that model instead of a training step: 100 new tokens
sampled with the KV cache (`tinylm.generate.strategies.generate_with`), as `--steps` samples per block.

    python benchmarks/bench_cpu_threads.py                    # all scenes, 8 blocks of 5 steps each
    python benchmarks/bench_cpu_threads.py --blocks 4 --steps 3 --scenes loaded
    python benchmarks/bench_cpu_threads.py --work generate --steps 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time

import torch

from tinylm.device import busy_cpus, choose_cpu_threads, usable_cpus
from tinylm.model.config import GPTConfig
from tinylm.model.gpt import GPT


def _spin() -> None:
    while True:
        pass


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, dropout=0.0, bias=False))


def _generate_fn():
    from tinylm.generate.config import SamplingConfig
    from tinylm.generate.strategies import generate_with

    model, config = _model().eval(), SamplingConfig(max_new_tokens=100, temperature=0.8, top_k=200, seed=1)
    return lambda: generate_with(model, [[1, 2, 3]], config)


def _step_fn():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 65, (12, 64))
    y = torch.randint(0, 65, (12, 64))

    def step() -> None:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def scene(name: str, blocks: int, steps: int, default: int, work: str = "step") -> dict[str, float]:
    spinners = []
    if name in ("loaded", "half"):
        n = usable_cpus() if name == "loaded" else max(1, usable_cpus() // 2)
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
        for p in spinners:
            p.start()
        time.sleep(2)
    try:
        busy = busy_cpus()
        torch.set_num_threads(default)
        choice, why = choose_cpu_threads(default=default, busy=busy)
        step = _generate_fn() if work == "generate" else _step_fn()
        for _ in range(3):
            step()  # warm-up
        times: dict[int, list[float]] = {}
        counts = sorted({1, default, choice})
        for _ in range(blocks):
            for n in counts:
                torch.set_num_threads(n)
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step()
                    times.setdefault(n, []).append(time.perf_counter() - t0)
        med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
        load = os.getloadavg()
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.join()
    rows = ", ".join(f"{n} thread(s) {ms:.0f} ms" for n, ms in med.items())
    print(f"{name}: busy CPUs {busy:.2f} of {usable_cpus()}, load average {load[0]:.2f} {load[1]:.2f}; "
          f"tinylm's choice {why}")
    best = min(med[1], med[default])
    print(f"  {rows}; choice/best of 1 and {default}: {med[choice] / best:.2f}x; "
          f"choice/today ({default} threads): {med[choice] / med[default]:.2f}x")
    return {"choice": med[choice], "best": best, "today": med[default]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scenes", default="quiet,half,loaded")
    ap.add_argument("--work", choices=("step", "generate"), default="step")
    args = ap.parse_args()
    default = torch.get_num_threads()
    print(f"{platform.machine()} {usable_cpus()} CPUs ({platform.processor() or 'cpu'}), torch {torch.__version__}, "
          f"torch default {default} threads; timing: {args.work}")
    for name in args.scenes.split(","):
        scene(name, args.blocks, args.steps, default, args.work)


if __name__ == "__main__":
    main()
