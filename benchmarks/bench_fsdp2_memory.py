"""Per-rank memory of FSDP2 (`--trainer.strategy fsdp`) vs DDP on 1, 2 and 4 CPU ranks (gloo), beside what
`tinylm plan` predicts for each: the states held between steps, and the peak of a whole training step.

Each configuration runs as its own `torchrun --standalone --nproc_per_node N` job: the GPT is built on every rank,
sharded as `TinyLM.configure_model` shards it (tinylm.train.parallel.shard_gpt) or left whole (DDP keeps a whole
replica per rank), and trained two steps with tinylm's AdamW (its groups, fused) and clipping, the gradients freed
after each step as tinylm frees them. Two figures per rank, the largest rank's reported:
    states  right after the first optimizer step (weights, gradients and both moments alive at once), the bytes of
            every tensor of the three that this rank holds (storages counted once; a sharded parameter counts its
            local shard); the plan's is `memory(...).states` (no gathered parameters: FSDP2 has freed them)
    peak    of the second step (forward, backward, clipping, optimizer step): the states alive at its start plus the
            running sum of the profiler's allocation events (`profile_memory=True`; every tensor allocated and
            freed, FSDP2's gathered parameters, gradient and reduce-scatter buffers included, on every thread; the
            profiler's memory timeline cannot follow FSDP2's in-place collectives); the plan's is `memory(...).peak`
(DDP's gradient buckets are not counted: this DDP is the all-reduce by hand, the bytes of DDP's result.)

    python benchmarks/bench_fsdp2_memory.py                  # 8 layers x 512, vocab 8192 (~30M parameters)
    python benchmarks/bench_fsdp2_memory.py --n_layer 4 --n_embd 256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

import torch


def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for t in tensors:
        t = t.to_local() if isinstance(t, DTensor) else t
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _peak_bytes(step, held: int) -> int:
    """``held`` bytes plus the highest running sum of the allocations the profiler sees while ``step()`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = top = 0
    for e in events:
        live += e.nbytes()
        top = max(top, live)
    return held + top


def _rank(args: argparse.Namespace) -> None:
    """One rank of one configuration (under torchrun): print the measured and planned bytes as JSON on rank 0."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from tinylm.model import GPT, GPTConfig
    from tinylm.studies.plan import memory
    from tinylm.train.optim import build_optimizer
    from tinylm.train.parallel import broadcast_weights, clip_by_global_norm, shard_gpt

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=64, n_layer=args.n_layer, n_head=args.n_embd // 64,
                       n_embd=args.n_embd)
    model = GPT(config)
    with torch.device("meta"):
        reference = GPT(config)  # the plan's model (whole, counted as `tinylm plan` counts it)
    broadcast_weights(model)
    if args.strategy == "fsdp2":
        shard_gpt(model, init_device_mesh("cpu", (world,)), reshard_after_forward=True, bf16=False)
    opt = build_optimizer(model, optimizer="adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02,
                          muon_momentum=0.95, muon_weight_decay=0.0, fused=True)
    x = torch.randint(0, args.vocab, (2, 64))
    params = list(model.parameters())

    def step(measure_states: bool = False) -> dict[str, int]:
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        if args.strategy == "ddp":  # what DDP's all-reduce does to the gradients (the bytes are the same either way)
            for p in params:
                dist.all_reduce(p.grad)
                p.grad /= world
        clip_by_global_norm(model, 1.0)
        opt.step()
        held = {"weights": _local_bytes(params), "gradients": _local_bytes(p.grad for p in params),
                "optimizer": _local_bytes(v for s in opt.state.values() for v in s.values()
                                          if isinstance(v, torch.Tensor) and v.numel() > 1)} if measure_states else {}
        opt.zero_grad(set_to_none=True)  # as tinylm does right after each step
        return held

    states = step(measure_states=True)
    peak = _peak_bytes(step, states["weights"] + states["optimizer"])  # (the gradients were freed)
    planned = memory(reference, batch_size=2, precision="32-true", checkpointing=False,
                     shards=world if args.strategy == "fsdp2" else 1, fsdp=args.strategy == "fsdp2")
    totals = torch.tensor([sum(states.values()), peak], dtype=torch.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.MAX)  # the largest rank's (uneven shards)
    if dist.get_rank() == 0:
        print(json.dumps({"strategy": args.strategy, "ranks": world, "states": int(totals[0]), "peak": int(totals[1]),
                          "planned_states": planned.states, "planned_peak": planned.peak,
                          "params": reference.num_params()}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_layer", type=int, default=8)
    parser.add_argument("--n_embd", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--strategy", choices=("ddp", "fsdp2"), help=argparse.SUPPRESS)  # set for a rank
    args = parser.parse_args()
    if args.strategy:
        return _rank(args)
    rows = []
    for ranks in (1, 2, 4):
        for strategy in ("ddp", "fsdp2"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                   __file__, "--strategy", strategy, "--n_layer", str(args.n_layer), "--n_embd", str(args.n_embd),
                   "--vocab", str(args.vocab)]
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                  check=False)
            if done.returncode:
                sys.exit(done.stderr[-3000:])
            rows.append(json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("{"))))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}; {rows[0]['params']:,} "
          f"parameters ({args.n_layer} layers x {args.n_embd}, vocab {args.vocab}), fp32, AdamW; MiB per rank")
    print(f"{'strategy':<8} {'ranks':>5} {'states':>8} {'plan':>8} {'ratio':>6} {'step peak':>10} {'plan':>8} "
          f"{'ratio':>6}")
    for r in rows:
        print(f"{r['strategy']:<8} {r['ranks']:>5} {r['states'] / 2**20:>8.1f} {r['planned_states'] / 2**20:>8.1f} "
              f"{r['planned_states'] / r['states']:>6.3f} {r['peak'] / 2**20:>10.1f} {r['planned_peak'] / 2**20:>8.1f} "
              f"{r['planned_peak'] / r['peak']:>6.3f}")
    ddp2, fsdp2 = (next(r for r in rows if r["strategy"] == s and r["ranks"] == 2) for s in ("ddp", "fsdp2"))
    print(f"FSDP2 / DDP at 2 ranks: states {fsdp2['states'] / ddp2['states']:.3f}x, "
          f"step peak {fsdp2['peak'] / ddp2['peak']:.3f}x")


if __name__ == "__main__":
    main()
