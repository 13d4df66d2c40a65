"""Checks of how a run's processes were started (several nodes told by hand where node 0 is; torchrun, srun or
sbatch starting another number of processes than the run's options ask for), before Lightning waits forever or
raises its own traceback from every rank."""

from __future__ import annotations

import os
from typing import Any


def refuse_launched(command: str, what: str, instead: str = "") -> None:
    """Refuse a one-process command (eval, lr-find) that a launcher started several times (torchrun, or by hand:
    WORLD_SIZE > 1; srun sets no WORLD_SIZE): every rank ran all of it, ``what`` says with which result;
    ``instead``: where the work is split over ranks."""
    world = os.environ.get("WORLD_SIZE", "").strip()
    if world.isdigit() and int(world) > 1:
        raise ValueError(f"tinylm {command} runs in one process, but a launcher started {world} (WORLD_SIZE={world}): "
                         f"{what}; run it alone, without torchrun{instead}")


def check_nodes(nodes: int, subcommand: str) -> None:
    """Several nodes: a cluster that starts them, or each told by hand where node 0 is and which node it is (each
    node without MASTER_PORT picked a port of its own, and they never met; a NODE_RANK past the nodes waited too)."""
    hand = ("run the same command on every node with MASTER_ADDR (node 0's address), MASTER_PORT and NODE_RANK "
            "(0, 1, ...) set, or launch it with srun or torchrun")
    if subcommand == "validate":  # (the run's own num_nodes, read from its settings: this machine validates alone)
        hand += "; or validate on this machine alone: --trainer.num_nodes 1"
    if _cluster_found():
        return
    env = os.environ
    if "MASTER_ADDR" not in env:  # (Kubeflow's PyTorchJob sets it too: Lightning cannot detect Kubeflow)
        raise ValueError(f"trainer.num_nodes {nodes} but no cluster was found (SLURM, torchrun, MPI, LSF) "
                         f"and MASTER_ADDR is unset: this node would wait for the others forever; {hand}")
    if not env.get("MASTER_PORT", "").strip().isdigit():
        raise ValueError(f"trainer.num_nodes {nodes} with MASTER_ADDR set by hand needs MASTER_PORT too (a free port "
                         f"of node 0, the same on every node), got {env.get('MASTER_PORT', 'none')!r}: each node "
                         f"would pick a port of its own and wait for the others forever; {hand}")
    rank = env.get("NODE_RANK", env.get("GROUP_RANK"))  # (Lightning's LightningEnvironment reads both)
    if "RANK" in env and "WORLD_SIZE" in env:  # Kubeflow's PyTorchJob (--trainer.plugins KubeflowEnvironment)
        return
    if rank is None or not rank.strip().isdigit() or int(rank) >= nodes:
        raise ValueError(f"trainer.num_nodes {nodes} with MASTER_ADDR set by hand needs NODE_RANK, this node's "
                         f"number, 0 to {nodes - 1} (0 on MASTER_ADDR's node), got {rank!r}: the nodes would wait "
                         f"for one that never comes; {hand}")


def check_launched_processes(nodes: Any, devices: int | None) -> None:
    """A launcher that started another number of processes than trainer.num_nodes x trainer.devices (`torchrun
    --nproc_per_node 2` with devices left at auto, one process on a CPU): Lightning's check (its cluster environment's
    validate_settings) raised from every rank, as a traceback, once the model and data were set up."""
    env = os.environ
    if devices is None or not isinstance(nodes, int):
        return
    if "TORCHELASTIC_RUN_ID" in env and env.get("WORLD_SIZE", "").isdigit():  # torchrun (Lightning's detection)
        world, per_node = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE") or env["WORLD_SIZE"])
        # the same product, more a node (--nnodes 1 --nproc_per_node 2 for 2 nodes x 1 device): Lightning's
        # IndexError on the node's second process, whose local rank has no device
        split = bool(env.get("LOCAL_WORLD_SIZE")) and per_node > devices
        if world != devices * nodes or split:
            asks = f"trainer.num_nodes {nodes} x trainer.devices {devices} is {devices * nodes}" if \
                world != devices * nodes else f"trainer.devices {devices} asks for {devices} a node"
            raise ValueError(f"torchrun started {world} processes ({world // per_node} node(s) x --nproc_per_node "
                             f"{per_node}), but {asks}; pass --trainer.num_nodes {world // per_node} --trainer.devices "
                             f"{per_node} (torchrun's --nnodes and --nproc_per_node)")
    elif "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):  # srun, as Lightning
        ntasks = env["SLURM_NTASKS"].strip()
        if ntasks.isdigit() and int(ntasks) > 1 and "SLURM_NTASKS_PER_NODE" not in env:  # Lightning's RuntimeError
            raise ValueError(f"SLURM_NTASKS={ntasks} (sbatch/salloc --ntasks {ntasks}) but SLURM_NTASKS_PER_NODE is "
                             "unset: Lightning runs one process per task and needs the tasks per node; submit with "
                             f"--ntasks-per-node (= --trainer.devices) and start tinylm with srun, or unset "
                             "SLURM_NTASKS to run this one process alone")
        tasks, nnodes = env.get("SLURM_NTASKS_PER_NODE", ""), env.get("SLURM_NNODES", "")
        wrong = [(f"--ntasks-per-node {tasks}", f"trainer.devices {devices}", f"--trainer.devices {tasks}")
                 if tasks.isdigit() and int(tasks) != devices else None,
                 (f"--nodes {nnodes}", f"trainer.num_nodes {nodes}", f"--trainer.num_nodes {nnodes}")
                 if nnodes.isdigit() and int(nnodes) != nodes else None]
        if wrong := [w for w in wrong if w]:
            raise ValueError(f"SLURM runs this job with {' and '.join(w[0] for w in wrong)}, but "
                             f"{' and '.join(w[1] for w in wrong)}; pass {' '.join(w[2] for w in wrong)}")


def _cluster_found() -> bool:
    """Whether this process was started by a cluster Lightning detects (else the nodes are told by hand where the
    others are: MASTER_ADDR, MASTER_PORT, NODE_RANK)."""
    from lightning.fabric.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    return any(env.detect() for env in (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment, MPIEnvironment))


def check_same_start(strategy: Any, step: int | None, run_dir: Any, subcommand: str) -> None:
    """Once the ranks are connected (before their first collective of the run): refuse, on every rank together, ranks
    that start from different checkpoints. Each node reads ``--ckpt_path last`` (or a path) on its own disk: nodes
    with a run folder each (``runs/`` on a local disk) found node 0's checkpoint on node 0 alone, node 1 started a new
    run while node 0 resumed, and their first collectives differed: every rank waited for good, without a word and
    deaf to SIGTERM (torch's 30 minutes); a stale copy at another step on one node waited the same way. ``step``:
    the checkpoint step this rank starts from, None for none (a new run)."""
    import torch
    import torch.distributed as dist

    from tinylm.errors import TinyLMError

    mine = torch.tensor([-1 if step is None else int(step)], device=strategy.root_device)
    found = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(found, mine)  # (Lightning's all_gather warns of torch's deprecated one)
    steps = [int(s.item()) for s in found]
    if len(set(steps)) == 1:
        return
    by_step: dict[int, list[int]] = {}
    for rank, at in enumerate(steps):
        by_step.setdefault(at, []).append(rank)
    new = "none, a new run" if subcommand == "fit" else "none"
    said = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: "
                     f"{new if at < 0 else f'step {at}'}" for at, rs in sorted(by_step.items(), reverse=True))
    here = f"no checkpoint in {run_dir}" if step is None else f"step {step} in {run_dir}"
    error = TinyLMError(f"the nodes start from different checkpoints ({said}; this node found {here}): each node "
                        "reads the run folder on its own disk, and they would wait for each other for good; every "
                        "node must see the same run folder (docs/distributed.md): pass --trainer.default_root_dir "
                        f"DIR on a filesystem the nodes share, or copy {run_dir} to every node")
    error.said = strategy.local_rank != 0  # (each node's first rank says it, on that node's console)
    raise error
