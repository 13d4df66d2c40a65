"""Parallelism: how a run spreads over devices and nodes, on Lightning's own strategies (no home-made sharding or
launcher). The home of everything strategy-specific: which strategies tinylm trains with and why the others are
refused, and where model sharding (FSDP2's `fully_shard` through Lightning's ModelParallelStrategy, planned in
DESIGN's "Scale") goes when it comes.

Today: one device, or DDP (`--trainer.strategy ddp`, `ddp_fork` on a CPU; `--trainer.num_nodes N` under SLURM,
torchrun or by hand). The ranks as processes (watched, and why one was lost) are tinylm.cli.ranks; the data each
rank reads is tinylm.data.loader's.
"""

from __future__ import annotations

from typing import Any


def check_strategy(trainer_cfg: dict[str, Any]) -> None:
    """Refuse the strategies that would train another model than the one configured, or that cannot start a
    tinylm run, naming the one to use."""
    strategy = trainer_cfg.get("strategy") or trainer_cfg.get("strategy.class_path")  # a name, or a class
    start = strategy if isinstance(strategy, str) and "." not in strategy else \
        trainer_cfg.get("strategy.init_args.start_method")
    if isinstance(strategy, str) and any(k in strategy.lower() for k in ("fsdp", "modelparallel")):
        raise ValueError(f"trainer.strategy {strategy!r} is not supported by tinylm: FSDP hands the optimizer "
                         "flattened shards, so weight decay (chosen by a parameter's shape), Muon (whole "
                         "matrices) and gradient clipping (one shard's norm) would silently train another "
                         "model; use --trainer.strategy ddp (`tinylm plan --config ...` shows the memory a "
                         "device needs)")
    if isinstance(start, str) and "spawn" in start:
        raise ValueError(f"trainer.strategy {strategy!r} starts its processes by spawning, which pickles the "
                         "running trainer and model (tinylm's run holds open files); use --trainer.strategy ddp "
                         "(one process per device, each running the command: the same training)")
