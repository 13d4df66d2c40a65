"""Per-rank memory of weights + gradients + AdamW state: FSDP2 (`--trainer.strategy fsdp`) vs DDP, on 1 and 2
CPU ranks (gloo), beside what `tinylm plan` predicts for each.

Each configuration runs as its own `torchrun --standalone --nproc_per_node N` job: the GPT is built on every rank,
sharded as `TinyLM.configure_model` shards it (tinylm.train.parallel.shard_gpt) or left whole (DDP keeps a whole
replica per rank), trained one step with tinylm's AdamW (its groups, fused) and clipping, and then, right after the
optimizer step (weights, gradients and both moments alive at once: their peak), the bytes of every tensor of the
three that this rank holds are summed (storages counted once; a sharded parameter counts its local shard).
The plan's figure is `tinylm.studies.plan.memory(...)`'s weights + gradients + optimizer with shards = N for FSDP2.
(DDP's gradient buckets, another copy of the gradients unless gradient_as_bucket_view, are not counted: the DDP
figure is a lower bound, the ratio an upper one.)

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
    reference = GPT(config)  # the plan's model (whole)
    broadcast_weights(model)
    if args.strategy == "fsdp2":
        shard_gpt(model, init_device_mesh("cpu", (world,)), reshard_after_forward=True, bf16=False)
    opt = build_optimizer(model, optimizer="adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02,
                          muon_momentum=0.95, muon_weight_decay=0.0, fused=True)
    x = torch.randint(0, args.vocab, (2, 64))
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    if args.strategy == "ddp":  # what DDP's all-reduce does to the gradients (the bytes are the same either way)
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    clip_by_global_norm(model, 1.0)
    opt.step()
    params = list(model.parameters())
    measured = {"weights": _local_bytes(params), "gradients": _local_bytes(p.grad for p in params),
                "optimizer": _local_bytes(v for s in opt.state.values() for v in s.values()
                                          if isinstance(v, torch.Tensor) and v.numel() > 1)}
    planned = memory(reference, batch_size=2, precision="32-true", checkpointing=False,
                     shards=world if args.strategy == "fsdp2" else 1)
    totals = torch.tensor([sum(measured.values())], dtype=torch.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.MAX)  # the largest rank's (uneven shards)
    if dist.get_rank() == 0:
        print(json.dumps({"strategy": args.strategy, "ranks": world, "measured": int(totals.item()),
                          "planned": planned.weights + planned.gradients + planned.optimizer,
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
    for ranks in (1, 2):
        for strategy in ("ddp", "fsdp2"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                   __file__, "--strategy", strategy, "--n_layer", str(args.n_layer), "--n_embd", str(args.n_embd),
                   "--vocab", str(args.vocab)]
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                  check=False)
            if done.returncode:
                sys.exit(done.stderr[-3000:])
            rows.append(json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("{"))))
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}; {rows[0]['params']:,} "
          f"parameters ({args.n_layer} layers x {args.n_embd}, vocab {args.vocab}), fp32, AdamW")
    print(f"{'strategy':<8} {'ranks':>5} {'measured MiB/rank':>18} {'plan MiB/rank':>14} {'plan/measured':>13}")
    for r in rows:
        print(f"{r['strategy']:<8} {r['ranks']:>5} {r['measured'] / 2**20:>18.1f} {r['planned'] / 2**20:>14.1f} "
              f"{r['planned'] / r['measured']:>13.3f}")
    ddp2, fsdp2 = (next(r for r in rows if r["strategy"] == s and r["ranks"] == 2) for s in ("ddp", "fsdp2"))
    print(f"FSDP2 / DDP at 2 ranks: {fsdp2['measured'] / ddp2['measured']:.3f}x")


if __name__ == "__main__":
    main()
