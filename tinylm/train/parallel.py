"""Parallelism: how a run spreads over devices and nodes, on Lightning's own strategies (no home-made sharding or
launcher). The home of everything strategy-specific: which strategies tinylm trains with and why the others are
refused, and how FSDP2 shards the model.

- One device, or DDP (`--trainer.strategy ddp`, `ddp_fork` on a CPU): every rank holds the whole model and optimizer.
- FSDP2 (`--trainer.strategy fsdp`, or `fsdp2`): Lightning's ModelParallelStrategy with every rank of every node in
  one data-parallel dimension (`FSDP2Strategy`); `shard_gpt` applies `fully_shard` to each transformer block and
  then to the whole GPT (torchtitan's pattern). Parameters become DTensors that keep their global shapes, so the
  optimizer's groups by shape, Muon's whole matrices and clipping by the global norm hold as under DDP.
  Checkpoints are distributed (DCP) folders, one file per rank, written atomically (`FSDP2Strategy.save_checkpoint`).
  FSDP1 (Lightning's FSDPStrategy) stays refused: it hands the optimizer flattened shards.

`--trainer.num_nodes N` works with each (SLURM, torchrun or by hand). The ranks as processes (watched, and why one
was lost) are tinylm.cli.ranks; the data each rank reads is tinylm.data.loader's.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from tinylm.checkpoint import beside, remove_checkpoint, remove_leftovers
from tinylm.paths import swap_in

FSDP2_NAMES = ("fsdp", "fsdp2")
"""The --trainer.strategy names that mean FSDP2 (a Lightning user types `fsdp`)."""


_NOT_TRAINED_WITH = {
    ("deepspeed",): "DeepSpeed clips gradients itself (tinylm's clipping, and train/grad_norm, would not run: "
                    "Lightning only warns) and its ZeRO stages hand the optimizer flattened shards (weight decay "
                    "chosen by shape, Muon), so it would silently train another model",
    ("xla", "tpu"): "the XLA strategies train on TPUs through torch_xla, and tinylm trains on CPUs and GPUs",
}
"""Lightning's strategy families that tinylm refuses (a name or class path holding one of the words), and why."""


def _holds_word(strategy: str, words: tuple[str, ...]) -> bool:
    """Whether ``strategy`` (a name or a class path) holds one of ``words`` as a word of its own: after a start, a
    non-letter or a lower-case letter in CamelCase (single_tpu, xla_debug, DeepSpeedStrategy, SingleDeviceXLAStrategy),
    not inside another word (a user's OutputLoggingDDP)."""
    return any(re.search(rf"(?:^|(?<=[^A-Za-z]))(?i:{w})|(?<=[a-z]){w[0].upper()}(?i:{w[1:]})", strategy)
               for w in words)


def check_strategy(trainer_cfg: dict[str, Any]) -> None:
    """Refuse the strategies that would train another model than the one configured, or that cannot start a
    tinylm run, naming the one to use."""
    strategy = trainer_cfg.get("strategy") or trainer_cfg.get("strategy.class_path")  # a name, or a class
    if isinstance(strategy, FSDP2Strategy) or isinstance(strategy, str) and strategy.lower() in FSDP2_NAMES:
        return
    start = strategy if isinstance(strategy, str) and "." not in strategy else \
        trainer_cfg.get("strategy.init_args.start_method")
    why = next((why for words, why in _NOT_TRAINED_WITH.items()
                if isinstance(strategy, str) and _holds_word(strategy, words)), None)
    if why is not None:  # (before FSDP1's: XLAFSDPStrategy is a TPU's)
        raise ValueError(f"trainer.strategy {strategy!r} is not supported by tinylm: {why}; "
                         "use --trainer.strategy ddp (the model and AdamW fit one device) or --trainer.strategy "
                         "fsdp (FSDP2: shards weights, gradients and AdamW state), or leave it out on one device")
    if isinstance(strategy, str) and any(k in strategy.lower() for k in ("fsdp", "modelparallel")):
        raise ValueError(f"trainer.strategy {strategy!r} is not supported by tinylm: FSDP1 hands the optimizer "
                         "flattened shards, so weight decay (chosen by a parameter's shape), Muon (whole "
                         "matrices) and gradient clipping (one shard's norm) would silently train another "
                         "model, and ModelParallelStrategy's own defaults shard nothing within a node; use "
                         "--trainer.strategy fsdp (FSDP2, which keeps every parameter's shape) or "
                         "--trainer.strategy ddp (`tinylm plan --config ...` shows the memory a device needs)")
    if isinstance(start, str) and ("spawn" in start or start.lower() == "forkserver"):
        raise ValueError(f"trainer.strategy {strategy!r} starts its processes by "
                         f"{'a fork server' if start.lower() == 'forkserver' else 'spawning'}, which pickles the "
                         "running trainer and model (tinylm's run holds open files); use --trainer.strategy ddp "
                         "(one process per device, each running the command: the same training; in a notebook's "
                         "kernel, which has no command line to run again, --trainer.strategy ddp_notebook)")


def check_strategy_name(strategy: Any) -> None:
    """A --trainer.strategy name Lightning does not know: one line listing the names tinylm trains with, not
    Lightning's, whose "Example choices" are ddp_spawn and deepspeed (both refused by `check_strategy`)."""
    from lightning.pytorch.strategies import StrategyRegistry

    if not isinstance(strategy, str) or "." in strategy:  # an instance, or a class path (jsonargparse's to check)
        return
    name = strategy.strip().lower()
    if name == "auto" or name in FSDP2_NAMES or name in StrategyRegistry.available_strategies():
        return
    names = [f"{n} (FSDP2; also {', '.join(FSDP2_NAMES[1:])})" if n == FSDP2_NAMES[0] else n
             for n in accepted_strategies() if "find_unused" not in n and n not in FSDP2_NAMES[1:]]
    raise ValueError(f"trainer.strategy {strategy!r} is not a strategy; tinylm trains with {', '.join(names)}, the "
                     "ddp ones also as NAME_find_unused_parameters_true, or a Strategy's class path; e.g. "
                     "--trainer.strategy ddp, or leave it out on one device")


def accepted_strategies() -> list[str]:
    """The strategy names tinylm trains with: auto, Lightning's registered names `check_strategy` lets through
    (fsdp meaning FSDP2), and fsdp2."""
    from lightning.pytorch.strategies import StrategyRegistry

    def accepted(name: str) -> bool:
        try:
            check_strategy({"strategy": name})
        except ValueError:
            return False
        return True

    return ["auto", *(n for n in StrategyRegistry.available_strategies() if accepted(n)), "fsdp2"]


def resolve_strategy(strategy: Any) -> Any:
    """The Trainer's strategy for ``--trainer.strategy``: FSDP2Strategy for its names, else what was given."""
    if isinstance(strategy, str) and strategy.lower() in FSDP2_NAMES:
        return FSDP2Strategy()
    return strategy


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as FSDP2 alone: one data-parallel (sharding) dimension over every device
    of every node (its own defaults shard over the nodes only and use the devices of a node for tensor
    parallelism), and sharded checkpoints written atomically."""

    strategy_name = "fsdp2"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(data_parallel_size=1, tensor_parallel_size=1, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # known once the devices are
        self._tensor_parallel_size = 1
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A DCP folder written as ``<name>.tmp``, flushed, then swapped into place by `tinylm.paths.swap_in`: one
        atomic exchange with the previous checkpoint (a folder, or the file one device or DDP wrote), which is then
        removed from ``<name>.tmp``. A kill at any point leaves the previous checkpoint or the new one, whole, under
        ``<name>`` (where the file system cannot exchange: two renames, the previous one set aside as ``<name>.old``
        in between, when there is none by that name). What an earlier killed save or removal left goes first."""
        path = Path(self.broadcast(str(filepath)))
        tmp = beside(path, ".tmp")
        if self.is_global_zero:
            remove_leftovers(path)
        self.barrier()
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier()  # every rank's shard is written
        if self.is_global_zero:
            _fsync_tree(tmp)
            swap_in(tmp, path, aside=beside(path, ".old"))
        self.barrier()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A sharded folder as Lightning loads it (each rank reads its shards, on any number of ranks); a file
        (one device's or DDP's) read safely, its weights and optimizer state distributed into the shards."""
        path = Path(self.broadcast(str(checkpoint_path)))
        if not path.is_file():
            return super().load_checkpoint(path, weights_only)
        from lightning.fabric.strategies.model_parallel import _load_raw_module_state
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        from tinylm.checkpoint import load_checkpoint

        checkpoint = load_checkpoint(path)
        strict = self.lightning_module.strict_loading
        _load_raw_module_state(checkpoint.pop("state_dict"), self.model, strict=strict)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            set_optimizer_state_dict(self.model, optimizer, options=options,
                                     optim_state_dict=named_optimizer_state(state, optimizer, self.model))
        return checkpoint

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            remove_checkpoint(filepath)


def named_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer, model: nn.Module
                          ) -> dict[str, Any]:
    """A torch.optim state (entries keyed by parameter index, in the order of the groups' parameters) keyed by the
    parameters' names in ``model``, as torch.distributed.checkpoint keys it. The index is read through this very
    optimizer's groups (built as the saved one was), not the model's parameter order: tinylm's AdamW groups
    matrices before vectors, so the two orders differ (Lightning's own rekeying assumes they do not)."""
    from tinylm.train.optim import flat_state

    state = flat_state(state)  # Muon + AdamW saved by one device or DDP
    names = {id(p): name for name, p in model.named_parameters()}
    index = {i: names[id(p)] for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True)
             for i, p in zip(saved["params"], group["params"], strict=True)}
    return {"state": {index[i]: value for i, value in state["state"].items()},
            "param_groups": [{**saved, "params": [index[i] for i in saved["params"]]}
                             for saved in state["param_groups"]]}


def _fsync_tree(folder: Path) -> None:
    """Flush a folder's files and the folder itself to disk: what the swap then makes visible is whole."""
    for path in [*folder.iterdir(), folder]:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:  # some filesystems cannot fsync a folder
            pass
        finally:
            os.close(fd)


def shards_weights(trainer: Any) -> bool:
    """Whether ``trainer``'s strategy shards the weights over its ranks (FSDP2, or Lightning's ModelParallelStrategy
    it is): no rank holds the whole model (a rank-0 forward alone waits for the others), checkpoints are folders."""
    return isinstance(trainer.strategy, ModelParallelStrategy)


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are FSDP2's DTensors."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def shard_gpt(model: nn.Module, mesh: Any, *, reshard_after_forward: bool, bf16: bool) -> None:
    """``fully_shard`` each transformer block of the GPT ``model`` over the 1-D ``mesh``, then the GPT itself (its
    embeddings, final norm and LM head): each block's parameters are gathered just before it runs and freed after
    (``reshard_after_forward``: also between forward and backward, for less memory and one more all-gather).
    ``bf16``: the blocks compute in bf16 and gradients are reduced in fp32 (bf16-mixed precision)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if "tensor_parallel" in (mesh.mesh_dim_names or ()):
        if mesh["tensor_parallel"].size() > 1:
            raise ValueError("tinylm shards data-parallel only (FSDP2); this strategy has a tensor-parallel "
                             f"dimension of {mesh['tensor_parallel'].size()}: use --trainer.strategy fsdp")
        mesh = mesh["data_parallel"]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    # the GPT returns its logits as a view (of the padded vocabulary's); tinylm never changes them in place, which
    # is what FSDP2 warns of on every run
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # the root's parameters are used again first thing in the backward pass (the LM head): kept gathered
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)


def broadcast_weights(model: nn.Module) -> None:
    """Rank 0's weights on every rank before sharding (DDP does the same when it wraps the model): ranks that
    initialised differently (no seed) would otherwise each keep a shard of another model."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def clip_by_global_norm(model: nn.Module, max_norm: float, *, sharded: bool | None = None) -> torch.Tensor:
    """``clip_grad_norm_`` over ``model``'s parameters: the total norm of every gradient (before clipping), and the
    gradients scaled to at most ``max_norm``. Under FSDP2 each rank holds a shard of each gradient: the norm is
    the global one (all shards' squares summed over the ranks, as torchtitan computes it), not this rank's.
    ``sharded``: whether the model may be (the sharded way is right for plain tensors too); None looks at every
    parameter, which costs ~0.1 ms of Python per call on a small model. The norm is in fp32 at least: torch's of
    16-bit gradients (bf16-true) is a 16-bit number, 3 significant digits (train/grad_norm 1.453 for 1.449)."""
    if not (is_sharded(model) if sharded is None else sharded):
        if next(model.parameters()).dtype not in (torch.float16, torch.bfloat16):
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros(())
        try:  # one kernel for all of them, as clip_grad_norm_'s
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        except (TypeError, RuntimeError):  # (torch < 2.5: no dtype)
            norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
        norm = torch.linalg.vector_norm(torch.stack(norms))
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))  # as clip_grad_norm_ scales them
        return norm
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):  # a partial sum over the ranks until made whole
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
