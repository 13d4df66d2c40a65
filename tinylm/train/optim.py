"""Optimizers: AdamW (nanoGPT) or Muon for the hidden matrices + AdamW for the rest (modded-nanogpt, nanochat).

Design: Muon and AdamW live in ONE optimizer object, `MuonAdamW`, whose `param_groups` are the two inner optimizers'
own group dicts (AdamW's first). Lightning then sees a single optimizer, so its automatic optimization keeps
working unchanged: gradient accumulation, `configure_gradient_clipping` (one total norm over every parameter, logged
as train/grad_norm), AMP unscaling, the LambdaLR schedule (it scales every group's own initial lr by the same factor
per optimizer step: both optimizers follow the schedule), and checkpoints (`state_dict` holds both optimizers' states,
so a resume is exact). Two optimizers in Lightning would need manual optimization and re-implementing all of that.

Muon's step is `muon_step`: torch.optim.Muon's own maths on its own state, with the Newton–Schulz iterations of
every same-shape matrix run as one batched matmul chain (torch's loops over the matrices one by one), and attention's
stacked q, k, v weight (c_attn) orthogonalised as three matrices, as the speedruns' separate weights are. The
iterations run in bf16 on a GPU, as torch's and the speedruns' do, and in fp32 on a CPU without bf16 units, where
bf16 matmuls are 20-50x slower than fp32 ones (`newton_schulz_dtype`; benchmarks/bench_modern.py --ops).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from tinylm.errors import UnavailableError

OPTIMIZERS = ("adamw", "muon")
MUON_TORCH = "2.9"  # torch.optim.Muon arrived in PyTorch 2.9 (pytorch/pytorch#160213, August 2025)


def split_params(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(hidden matrices, other matrices and embeddings, 1-D gains and biases) of a tinylm GPT.

    Hidden matrices are the 2-D weights inside the blocks (attention and MLP projections): Muon's domain. The token
    and position embeddings and the LM head are 2-D too but are lookups / a classifier, which Muon's authors leave to
    AdamW; so are norms and biases (1-D).
    """
    hidden, matrices, vectors = [], [], []
    for name, p in model.named_parameters():  # a tied embedding is listed once
        if not p.requires_grad:
            continue
        if p.dim() < 2:
            vectors.append(p)
        elif ".h." in f".{name}":
            hidden.append(p)
        else:
            matrices.append(p)
    return hidden, matrices, vectors


class MuonAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` on `muon_groups` and `torch.optim.AdamW` on `adamw_groups`, stepped together as one
    optimizer. `param_groups` are the inner optimizers' own dicts (AdamW's first), so a scheduler or a user writing
    `group["lr"]` changes what the inner optimizer uses."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], *, muon: dict[str, Any],
                 adamw: dict[str, Any], splits: dict[int, int] | None = None) -> None:
        self.splits = splits or {}  # muon_step's: parameters stacking several matrices
        self.ns_dtype: torch.dtype | None = None  # muon_step's: None is newton_schulz_dtype(the parameters' device)
        # FSDP2's parameters (DTensors): the state_dict then takes torch.optim's own form (`flat_state`)
        self.sharded = any(type(p).__name__ == "DTensor" for g in muon_groups + adamw_groups for p in g["params"])
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw)
        self.muon = torch.optim.Muon(muon_groups, **muon)
        for group in self.muon.param_groups:
            group["optimizer"] = "muon"
        for group in self.adamw.param_groups:
            group["optimizer"] = "adamw"
        # no defaults: add_param_group appends the very same group dicts, adding no keys
        super().__init__(self.adamw.param_groups + self.muon.param_groups, defaults={})

    @property
    def state(self) -> dict:
        """Both optimizers' per-parameter states (the same dicts: Lightning moves them between devices in place)."""
        return {**self.adamw.state, **self.muon.state}

    @state.setter
    def state(self, value: Any) -> None:  # Optimizer.__init__ assigns an empty state; the inner optimizers own it
        pass

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:  # Lightning's closure: forward, backward, clipping; then both optimizers step
            with torch.enable_grad():
                loss = closure()
        self.adamw.step()
        muon_step(self.muon, self.splits, self.ns_dtype)
        return loss

    def state_dict(self) -> dict[str, Any]:
        if self.sharded:  # torch.optim's own form over both optimizers' groups: what torch.distributed.checkpoint reads
            return torch.optim.Optimizer.state_dict(self)
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) == {"state", "param_groups"} and \
                [g.get("optimizer") for g in state_dict["param_groups"]] == [g["optimizer"] for g in self.param_groups]:
            state_dict = split_state(state_dict)  # a sharded run's (FSDP2), consolidated
        if set(state_dict) != {"adamw", "muon"}:
            raise ValueError("the checkpoint's optimizer state is not Muon + AdamW (it has keys "
                             f"{sorted(state_dict)}); resume with the model.optimizer the run was started with")
        self.adamw.load_state_dict(state_dict["adamw"])
        self.muon.load_state_dict(state_dict["muon"])
        # Optimizer.load_state_dict makes new group dicts: point ours at them, in place (LightningOptimizer and the
        # LR scheduler hold this very list), or the schedule would write lrs the inner optimizers never read
        self.param_groups[:] = self.adamw.param_groups + self.muon.param_groups


def flat_state(state: dict[str, Any]) -> dict[str, Any]:
    """MuonAdamW's state_dict as one torch.optim state over AdamW's groups then Muon's (parameters numbered on
    from AdamW's), the form a sharded (FSDP2) run saves; a state already in that form is returned as it is."""
    if set(state) != {"adamw", "muon"}:
        return state
    adamw, muon = state["adamw"], state["muon"]
    shift = sum(len(g["params"]) for g in adamw["param_groups"])
    return {"state": {**adamw["state"], **{i + shift: v for i, v in muon["state"].items()}},
            "param_groups": [{**g, "optimizer": "adamw"} for g in adamw["param_groups"]]
            + [{**g, "optimizer": "muon", "params": [i + shift for i in g["params"]]} for g in muon["param_groups"]]}


def split_state(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `flat_state`: {"adamw": ..., "muon": ...}, each torch.optim's own form (its groups tagged
    "optimizer" by MuonAdamW)."""
    parts: dict[str, dict[str, Any]] = {"adamw": {"state": {}, "param_groups": []},
                                        "muon": {"state": {}, "param_groups": []}}
    for group in state["param_groups"]:
        part = parts[group["optimizer"]]
        part["param_groups"].append(group)
        part["state"].update({i: state["state"][i] for i in group["params"] if i in state["state"]})
    return parts


def _muon_lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's per-matrix lr factor (`torch.optim._muon._adjust_lr`) for a (rows, cols) matrix."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1.0, rows / cols))  # Keller Jordan's
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))  # Moonshot's
    return 1.0


@functools.cache  # asked at every Muon step
def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles, AVX512-BF16): Intel Xeon from Sapphire Rapids
    (Cooper Lake for AVX512-BF16), AMD from Zen 4. Most laptops' CPUs, older servers and Arm do not (torch's private
    checks: False where this torch lacks them)."""
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_amx_tile_supported",
                                                                       "_is_avx512_bf16_supported"))


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """The precision of Muon's Newton–Schulz iterations on ``device``: bf16 on CUDA (torch.optim.Muon's and the
    speedruns', for tensor cores) and on a CPU with bf16 units (AMX ran them at ~430 GFLOP/s); fp32 on other CPUs,
    which run bf16 matmuls 20-50x slower than fp32 ones (a 2-core AMD EPYC: the laptop recipe's Muon step took
    1116 ms in bf16, 57 ms in fp32, beside 123 ms of forward and backward; benchmarks/bench_modern.py --ops)."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16_units()):
        return torch.bfloat16
    return torch.float32


def newton_schulz(x: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The quintic Newton–Schulz iteration of torch.optim.Muon (Keller Jordan's) on a batch of wide matrices
    x (n, rows, cols), rows <= cols, in ``dtype``: each ≈ U·Vᵀ of its SVD U·S·Vᵀ. Same operations, in the same order,
    as torch's one matrix at a time (and in its precision, bf16, by default); batched, the matmuls of the n matrices
    run as one call each."""
    a, b, c = coefficients
    x = x.to(dtype)
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT  # (n, rows, rows)
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # (a + b·G + c·G²)·x
    return x


@torch.no_grad()
def muon_step(muon: torch.optim.Optimizer, splits: dict[int, int] | None = None,
              ns_dtype: torch.dtype | None = None) -> None:
    """One step of the torch.optim.Muon `muon`, computed as its own `step()` computes it (Nesterov momentum in the
    "momentum_buffer" state, decoupled weight decay, orthogonalised update scaled per matrix shape), but with the
    Newton–Schulz iterations of all matrices of one shape batched (`newton_schulz`) and the momentum and decay as
    foreach ops. At the laptop recipe's 16 matrices of 4 shapes (24 of 3 with c_attn's q, k and v apart) this made
    the step 1.44x faster on CPU (benchmarks/bench_modern.py --ops); tests/train/test_optim.py checks it against
    torch's step.

    splits: {id(parameter): n} for parameters whose rows stack n matrices (attention's c_attn: q, k and v), each
    then orthogonalised on its own, as the speedruns do with separate q, k and v weights. ns_dtype: the precision
    of the Newton–Schulz iterations; None: `newton_schulz_dtype` of the parameters' device (torch.bfloat16 gives
    torch.optim.Muon's own step on any device)."""
    splits = splits or {}
    for group in muon.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        grads = [p.grad for p in params]
        if any(g.is_sparse or torch.is_complex(g) for g in grads):
            raise RuntimeError("Muon does not support sparse or complex gradients")
        bufs = []
        for p in params:
            state = muon.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            bufs.append(state["momentum_buffer"])
        lr, momentum = float(group["lr"]), group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = bufs
        if group["nesterov"] and _dtensors(grads):  # grad.lerp(buf, momentum) in place on copies: torch 2.11 has
            updates = [g.clone() for g in grads]  # no sharding rule (FSDP2) for the out-of-place _foreach_lerp
            torch._foreach_lerp_(updates, bufs, momentum)
        elif group["nesterov"]:
            updates = torch._foreach_lerp(grads, bufs, momentum)
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        _orthogonalized_steps(group, params, updates, splits, ns_dtype, lr)


def _dtensors(tensors: list[Tensor]) -> bool:
    """Whether ``tensors`` are DTensors (FSDP2's shards): they carry a device mesh."""
    return hasattr(tensors[0], "device_mesh")


def _orthogonalized_steps(group: dict, params: list[Tensor], updates: list[Tensor], splits: dict[int, int],
                          ns_dtype: torch.dtype | None, lr: float) -> None:
    """Add to each matrix of ``params`` its update orthogonalised (Newton–Schulz), times -lr and the shape's scale.

    FSDP2's parameters are DTensors, each rank holding a shard of rows: their updates are gathered whole (Muon
    orthogonalises whole matrices, never shards), orthogonalised on every rank alike, and each rank adds its own
    shard of the result: the very numbers one process computes (torchtitan's gather approach; nanochat's DistMuon
    instead orthogonalises each matrix on one owner rank and all-gathers the weights)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    whole = [u.full_tensor() if isinstance(u, DTensor) else u for u in updates]  # (rows, cols) each
    # where each orthogonalised update goes: the parameter itself, or for a sharded one a whole-matrix buffer
    targets = [torch.empty_like(w) if isinstance(p, DTensor) else p for p, w in zip(params, whole)]
    # (update, target, parameter index) of each matrix: a split parameter gives n of them, views of its rows
    pieces = []
    for i, p in enumerate(params):
        n = splits.get(id(p), 1)  # (chunk(1): the whole matrix, as a view that writes through to the parameter)
        pieces += [(u, t, i) for u, t in zip(whole[i].chunk(n), targets[i].chunk(n))]
    batches: dict[tuple, list[int]] = defaultdict(list)  # same shape, device and dtype: one batch
    for k, (u, _, _) in enumerate(pieces):
        batches[(u.shape, u.device, u.dtype)].append(k)
    alphas: dict[int, float] = {}  # sharded parameter index -> its alpha (its pieces share a shape)
    for (shape, device, _), index in batches.items():
        tall = shape[0] > shape[1]
        stacked = torch.stack([pieces[k][0] for k in index])  # (n, rows, cols)
        # wide views of tall matrices, as torch's .T
        ortho = newton_schulz(stacked.mT if tall else stacked, group["ns_coefficients"], group["ns_steps"],
                              group["eps"], ns_dtype or newton_schulz_dtype(device))
        ortho = list((ortho.mT if tall else ortho).unbind(0))
        alpha = -lr * _muon_lr_scale(group["adjust_lr_fn"], shape)
        local = [j for j, k in enumerate(index) if not isinstance(params[pieces[k][2]], DTensor)]
        if local:
            torch._foreach_add_([pieces[index[j]][1] for j in local], [ortho[j] for j in local], alpha=alpha)
        for j, k in enumerate(index):
            if isinstance(params[pieces[k][2]], DTensor):
                pieces[k][1].copy_(ortho[j])
                alphas[pieces[k][2]] = alpha
    for i, alpha in alphas.items():  # this rank's rows of each sharded matrix's update
        p = params[i]
        p.add_(distribute_tensor(targets[i], p.device_mesh, p.placements, src_data_rank=None), alpha=alpha)


class SkipFreedZeroGrad:
    """A LightningModule mixin for modules that free the gradients right after each optimizer step (TinyLM's
    ``optimizer_step``, as nanoGPT does): Lightning's own ``optimizer.zero_grad()``, which it calls after the next
    step's forward, then finds none to free, yet cost a profiler record and a pass over the parameters every step
    (0.2-0.3 ms of a 2-core CPU's step: docs/benchmarks.md). It runs only where a gradient is left (a step
    interrupted before its optimizer step)."""

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        if any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
            super().optimizer_zero_grad(epoch, batch_idx, optimizer)


def fused_adamw(device: torch.device) -> bool:
    """Whether AdamW runs its fused kernel on `device`: one pass over each parameter instead of the foreach
    implementation's dozen, and no parameter-sized temporaries. CUDA, and CPU from torch 2.4 (there the step takes
    0.37x the time at the laptop recipe's size, 0.25x at 6x384: benchmarks/bench_adamw.py)."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)


def build_optimizer(model: nn.Module, *, optimizer: str, lr: float, weight_decay: float, betas: tuple[float, float],
                    muon_lr: float, muon_momentum: float, muon_weight_decay: float,
                    fused: bool) -> torch.optim.Optimizer:
    """AdamW over everything (matrices and embeddings decay, 1-D gains and biases do not), or `MuonAdamW`: Muon for
    the hidden matrices at `muon_lr`, AdamW at `lr` for embeddings, LM head, norms and biases."""
    if optimizer == "adamw":
        params = [p for p in model.parameters() if p.requires_grad]  # in model order: checkpoints index by it
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
    hidden, matrices, vectors = split_params(model)
    if not hasattr(torch.optim, "Muon"):
        raise UnavailableError(f"model.optimizer=muon needs torch.optim.Muon (torch >= {MUON_TORCH}); this is torch "
                           f"{torch.__version__}: upgrade torch, or use model.optimizer=adamw")
    adamw_groups = [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]
    # adjust_lr_fn "original": Keller Jordan's scaling of the update by sqrt(max(1, rows/cols)), as modded-nanogpt
    muon = {"lr": muon_lr, "momentum": muon_momentum, "weight_decay": muon_weight_decay, "nesterov": True,
            "ns_steps": 5, "adjust_lr_fn": "original"}
    # c_attn stacks q, k and v: each is orthogonalised on its own, as the speedruns' separate weights are (over
    # the laptop recipe's 2000 steps this ended 0.013-0.017 nats lower than one (3C, C) matrix; docs/benchmarks.md)
    splits = {id(m.weight): 3 for name, m in model.named_modules() if name.endswith("attn.c_attn")}
    return MuonAdamW([{"params": hidden}], [g for g in adamw_groups if g["params"]], muon=muon,
                     adamw={"lr": lr, "betas": betas, "fused": fused}, splits=splits)
