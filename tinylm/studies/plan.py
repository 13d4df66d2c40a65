"""What a run costs before it runs: parameters, FLOPs, tokens, Chinchilla's compute-optimal size, memory per device
and wall time on a named GPU. Pure functions of the model and the run's settings; `tinylm plan` prints them, and
`plot_plan` draws them (memory per device; the run against Chinchilla's frontier).

Memory model (per device, bytes; checked against measured peaks in docs/benchmarks.md):
    weights    N x 4 (fp32 master weights; 2 under bf16-true), plus a 16-bit copy of every Linear layer's weight
               under *-mixed (autocast caches the cast weights for the backward pass; an embedding's lookup reads
               its table in fp32: an untied token table and the position table get no copy); with activation
               checkpointing one block's and the head's, the others' alive until the forward pass ends only
    gradients  N x the weights' element size
    optimizer  AdamW's exp_avg and exp_avg_sq: 2 x N x the weights' element size
    activations what autograd saves for backward per layer and token (measured with saved-tensor hooks): 17 x n_embd
               values, 2 of them in the fp32 residual stream (the norm inputs), 15 in the compute dtype (the Linear
               inputs, q, k, v, the attention output, the MLP's hidden values: 1+1+3+1+1+4+4; relu2 keeps as
               many as GELU, SwiGLU 4 x its hidden width instead of 8 x n_embd); rotary positions or qk_norm add
               the rotated/normed q and k (2 more, v keeps the c_attn output alive), qk_norm its fp32 normed copy
               (2 more in the fp32 stream). SDPA's fused kernels keep no T x T matrix; on a CPU with dropout SDPA takes
               its math path (q and k scaled apart, the softmax, its mask and the dropped weights: 2 x n_embd + 3 x
               n_head x T more, fp32) and each dropout keeps its mask (2 per layer, 1 for the embedding). Plus the
               head: three B x T x V fp32 tensors (fp64 under 64-true) are alive at once (the logits or their copy,
               the log-softmax, and in the backward pass the gradients of both), four with logit_softcap (its tanh).
               With activation checkpointing: one block input per layer, plus one block recomputed at a time;
               the first block is recomputed last, beside nearly all the gradients (peak: gradients + one block).
    FSDP2      weights, gradients and optimizer states / devices, plus the gathered parameters: the GPT's own
               (embeddings, final norm, head) through the step and two blocks' at a time (bf16 under *-mixed), on
               one device too (FSDP2 gathers into buffers of its own); and in the backward pass their gradients made
               whole (fp32) and two blocks' copies in flight in their reduce-scatters, beside the activations.
               Measured per rank with the profiler's allocation events at 1, 2 and 4 CPU ranks
               (benchmarks/bench_fsdp2_memory.py, three runs: the peak moves by up to three blocks' buffers from run
               to run with the collectives' timing): 0.92-1.08x of the step's peak; counting without these buffers,
               and without the gathered ones on one device, it was 0.80-0.88x
    peak       weights + optimizer + the larger of (activations + the first gradient the backward pass makes, the
               head's V x n_embd) and gradients (+ 2 V x n_embd with a tied table: its lookup's gradient and the
               sum, made last): tinylm frees the gradients right after each optimizer step, and the backward pass
               frees a layer's activations as it makes that layer's gradients, so the two are never all alive at
               once. Under gradient accumulation the summed gradients stay alive through the later micro-batches'
               forward passes: weights + optimizer + gradients + activations + that first gradient.
               Muon's step holds its updates and one shape's Newton–Schulz iterates beside weights, optimizer and
               gradients, which can be the peak when activations are small (AdamW is fused: no copies).
    workspace  on a GPU, the cuBLAS workspaces torch keeps beside the tensors: 32 MiB per handle on Hopper (cuBLAS's
               recommendation; 4-8 MiB before it: counted at 32), one handle for the forward pass's thread and one for
               autograd's backward thread. Measured on an H200 from a memory snapshot (benchmarks/gpu/plan_memory.py,
               docs/gpu/README.md run 5): 64 MiB of the 63-83 MiB plan missed at every size. Not counted: the CUDA
               context (~0.5 GiB, outside torch.cuda.max_memory_allocated).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from torch import nn

from tinylm.device import precision_dtypes
from tinylm.model import GPT, GPTShape
from tinylm.model.layers import swiglu_hidden
from tinylm.train.optim import split_params

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022: compute-optimal D ~ 20 N
# (name, FSDP2, activation checkpointing), fastest first: DDP replicates everything, checkpointing costs about one
# more forward pass, FSDP2 an all-gather and a reduce-scatter per block
CUDA_WORKSPACES = 2 * 32 * 2**20  # two cuBLAS handles' workspaces (module docstring: workspace)
STRATEGIES = (("DDP", False, False), ("DDP + activation ckpt", False, True), ("FSDP2", True, False),
              ("FSDP2 + activation ckpt", True, True))


@dataclass(frozen=True)
class Memory:
    """Bytes per device."""

    weights: int  # gathered included
    gradients: int
    optimizer: int
    activations: int
    peak: int
    gathered: int = 0  # of the weights: the parameters FSDP2 gathers whole for a while (0 without FSDP2)
    workspace: int = 0  # the CUDA libraries' workspaces, in the peak (0 on a CPU)

    @property
    def states(self) -> int:
        """Weights, gradients and optimizer state held between steps (FSDP2: this rank's shards)."""
        return self.weights - self.gathered + self.gradients + self.optimizer


@dataclass(frozen=True)
class Plan:
    """Everything `tinylm plan` reports about one run."""

    params: int  # total, the tied embedding once, the position table included
    non_embedding_params: int  # without the token and position tables and an untied LM head (Kaplan's N)
    flops_per_token: float  # training (forward + backward): 6N + the attention term
    tokens_per_step: int  # micro-batch x accumulation x devices x block_size
    max_steps: int
    tokens: int  # tokens_per_step x max_steps
    run_flops: float  # flops_per_token x tokens: 6 N D and the attention FLOPs
    tokens_per_param: float
    chinchilla_flops: float  # C = 6 N D, N all parameters: the budget of Chinchilla's rule of thumb
    optimal_params: float  # Chinchilla: the size whose 20 tokens/param spend this C
    optimal_tokens: float
    precision: str
    devices: int
    memory: Memory
    memory_checkpointed: Memory  # with model.activation_checkpointing
    gpu: str
    peak_flops: float | None  # dense FLOP/s of one `gpu` at `precision`
    mfu: float
    wall_seconds: float | None  # run_flops / (devices x peak x mfu), or / measured_flops
    measured_flops: float | None = None  # training FLOP/s measured on this CPU (tinylm.studies.cpu_rate)
    rate: str | None = None  # how measured_flops was measured, in words
    step_seconds: float | None = None  # wall_seconds / max_steps: one optimizer step
    strategies: dict[str, int] | None = None  # peak bytes per device of the run under each strategy (fits_on)


    def as_dict(self) -> dict:
        return asdict(self)


def compute_optimal(flops: float) -> tuple[float, float]:
    """(N, D) that spend ``flops`` = 6 N D with D = 20 N (Chinchilla's rule of thumb)."""
    n = (flops / (6.0 * CHINCHILLA_TOKENS_PER_PARAM)) ** 0.5
    return n, CHINCHILLA_TOKENS_PER_PARAM * n


def element_sizes(precision: str) -> tuple[int, int]:
    """(bytes per weight/gradient/optimizer value, bytes per activation in the compute dtype) for a Lightning
    precision string."""
    weights, compute = precision_dtypes(precision)  # 16-mixed / bf16-mixed: fp32 weights, 16-bit matmuls
    return weights.itemsize, compute.itemsize


def shape_of(model: GPT | GPTShape) -> GPTShape:
    """``model`` counted as a GPTShape (a GPT: from its config; its blocks are alike)."""
    return model if isinstance(model, GPTShape) else GPTShape.of(model.config)


def memory(model: GPT | GPTShape, *, batch_size: int, precision: str, checkpointing: bool, shards: int = 1,
           optimizer: str = "adamw", accumulate: int = 1, fsdp: bool = False, workspace: int = 0) -> Memory:
    """Bytes per device of one training step of ``model`` on micro-batches of ``batch_size`` x block_size tokens.

    shards: devices the weights, gradients and optimizer states are split over (FSDP2); 1 for DDP / one device.
    fsdp: FSDP2 (implied by shards > 1), on one device too: it gathers parameters into buffers of their own.
    optimizer: ``adamw`` (two moments per parameter) or ``muon`` (one momentum buffer per hidden matrix element,
    AdamW's two moments for the rest).
    accumulate: micro-batches per optimizer step (``trainer.accumulate_grad_batches``).
    workspace: bytes the device's libraries hold through the step (CUDA_WORKSPACES on a GPU), added to the peak.
    """
    shape = shape_of(model)
    c, one = shape.config, shape.one_block
    n = shape.num_params()
    state, act = element_sizes(precision)
    mixed = state != act
    fsdp = fsdp or shards > 1
    copies, cached = (k * act for k in _autocast_copies(shape, checkpointing)) if mixed and not fsdp else (0, 0)
    weights = n * state // shards + copies
    gathered = buffers = 0
    if fsdp:  # FSDP2 (tinylm.train.parallel.shard_gpt): the GPT's own parameters stay gathered through a step,
        # and two blocks' at a time (the one running, the next one prefetched), in the compute dtype
        root = sum(p.numel() for name, p in one.named_parameters() if ".h." not in f".{name}")
        block = sum(p.numel() for p in one.transformer.h[0].parameters())  # (every block alike)
        gathered = (root + 2 * block) * (act if mixed else state)
        weights = n * state // shards + gathered
        # in the backward pass their gradients made whole (fp32: FSDP2 reduces in fp32), and the copies of two blocks'
        # gradients in flight in their reduce-scatters
        buffers = (root + 4 * block) * state
    gradients = n * state // shards
    muon = shape.count(split_params(one)[0]) if optimizer == "muon" else 0
    optimizer_bytes = (2 * (n - muon) + muon) * state // shards
    tokens = batch_size * c.block_size
    resid = max(state, act)  # the residual stream stays fp32 under autocast
    mlp = 4 * swiglu_hidden(c.n_embd) if c.mlp == "swiglu" else 8 * c.n_embd
    qk = 2 * c.n_embd if (c.qk_norm or c.positions == "rope") else 0  # q and k rotated/normed apart from v
    per_layer = tokens * ((2 * c.n_embd + (qk if c.qk_norm else 0)) * resid + (7 * c.n_embd + qk + mlp) * act)
    # in fp32 at least (token_loss's at_least_fp32: fp64 under 64-true), see the module docstring
    head = (3 + (c.logit_softcap is not None)) * tokens * c.padded_vocab_size * max(act, 4)
    stream = tokens * c.n_embd * resid  # the input of the final norm / a checkpointed block
    if checkpointing:
        layers = c.n_layer * stream + per_layer  # block inputs + the one block being recomputed
    else:
        layers = c.n_layer * per_layer
    activations = layers + stream + head + (0 if workspace else _cpu_dropout(c, tokens, resid, checkpointing))
    first_grad = c.padded_vocab_size * c.n_embd * state  # the head's weight gradient, made first in the backward
    # a table tied to the head gets a second gradient last, from the token lookup (dense, V x C), and the sum of the
    # two: both alive beside every other gradient (measured: exactly 2 V x C more at that moment)
    tied = 2 * first_grad if c.tie_embeddings else 0
    if accumulate > 1:
        peak = weights + optimizer_bytes + max(gradients + activations + max(first_grad, cached) + buffers,
                                               gradients + tied)
    else:  # with checkpointing the first block is recomputed when nearly every gradient exists (and freed before
        # the tied table's lookup makes its gradient)
        peak = weights + optimizer_bytes + max(activations + max(first_grad, cached) + buffers,
                                               gradients + max(per_layer if checkpointing else 0, tied))
    # Muon under FSDP2 gathers every hidden matrix's update whole (and a whole buffer for its result) on each rank
    muon_step = _muon_step_memory(shape, state) + (muon * state if shards > 1 else 0) if muon else 0
    step = weights + optimizer_bytes + gradients + muon_step
    return Memory(weights, gradients, optimizer_bytes, activations, max(peak, step) + workspace, gathered, workspace)


def _cpu_dropout(config, tokens: int, resid: int, checkpointing: bool) -> int:
    """Bytes that dropout adds to the activations of a step on a CPU (a plan without CUDA's workspace), in every
    block or, with checkpointing, the one recomputed: each dropout keeps its mask as a tensor (2 a layer, 1 for the
    embedding), and SDPA with dropout takes its math path, which keeps q and k scaled apart and three B x H x T x T
    tensors (the softmax, its mask, the dropped weights); all in fp32 under autocast (measured with saved-tensor
    hooks). 0 without dropout."""
    c = config
    if not c.dropout:
        return 0
    layers = 1 if checkpointing else c.n_layer
    return tokens * ((4 * c.n_embd + 3 * c.n_head * c.block_size) * layers + c.n_embd) * resid


def _autocast_copies(shape: GPTShape, checkpointing: bool) -> tuple[int, int]:
    """(elements of the 16-bit weight copies alive through the backward pass, elements of those alive until the
    forward pass ends only) under *-mixed. Autocast casts the weights that multiply (the Linear layers', a tied table
    as the head's), never a lookup's table, and each layer saves its copy for the backward pass; a checkpointed block
    saves none: autocast's cache holds its copies through the forward pass, and the backward pass casts one block's
    at a time as it recomputes it (measured: the peak falls by n_layer - 1 blocks' copies)."""
    one = shape.one_block
    block = sum(m.weight.numel() for m in one.transformer.h.modules() if isinstance(m, nn.Linear))
    cached = (shape.config.n_layer - 1) * block if checkpointing else 0
    return shape.count(m.weight for m in one.modules() if isinstance(m, nn.Linear)) - cached, cached


def _muon_step_memory(shape: GPTShape, state: int) -> int:
    """What tinylm's Muon step holds besides the states: the Nesterov updates (one per hidden matrix element) and,
    while one shape's matrices are orthogonalised together, their stack and the Newton–Schulz iterates (bf16 on a GPU,
    fp32 on a CPU: counted at fp32's 4 bytes, the larger)."""
    shapes: dict[tuple, int] = {}
    hidden = {id(p) for p in split_params(shape.one_block)[0]}
    for name, p in shape.one_block.named_parameters():
        if id(p) in hidden:
            n = 3 if name.endswith("attn.c_attn.weight") else 1  # q, k and v orthogonalised apart
            size = (p.shape[0] // n, *p.shape[1:])
            shapes[size] = shapes.get(size, 0) + shape.count([p])
    total = sum(shapes.values())
    return total * state + max(shapes.values(), default=0) * (state + 3 * 4)


def plan(model: GPT | GPTShape, *, batch_size: int, accumulate: int, devices: int, max_steps: int, precision: str,
         gpu: str, mfu: float, peak_flops: float | None, fsdp: bool = False, optimizer: str = "adamw",
         measured_flops: float | None = None, rate: str | None = None) -> Plan:
    """The plan of a run of ``max_steps`` optimizer steps of ``model``.

    peak_flops: dense FLOP/s of one ``gpu`` at ``precision`` (tinylm.device.peak_flops_by_name), None if unknown.
    measured_flops: the training FLOP/s of the whole run measured on this machine (a CPU: its processes share it),
    described by ``rate``; it replaces peak x MFU.
    """
    shape = shape_of(model)  # (counted once, not again by each memory() below)
    c, one = shape.config, shape.one_block
    n = shape.num_params()
    embeddings = one.transformer.wte.weight.numel() + n - shape.num_params(exclude_position=True)  # + wpe, if any
    if not c.tie_embeddings:
        embeddings += one.lm_head.weight.numel()  # the un-embedding: a vocabulary matrix too
    per_token = shape.flops_per_token()
    tokens_per_step = batch_size * accumulate * devices * c.block_size
    tokens = tokens_per_step * max_steps
    run_flops = per_token * tokens
    # the rule of thumb D = 20N goes with C = 6ND: counting the attention FLOPs in C (a large share of run_flops
    # at long contexts) would call a run of 20 tokens/param "too small" and recommend a larger model
    n_opt, d_opt = compute_optimal(6.0 * n * tokens)
    shards = devices if fsdp else 1
    workspace = 0 if gpu.lower() == "cpu" else CUDA_WORKSPACES
    mem = {ckpt: memory(shape, batch_size=batch_size, precision=precision, checkpointing=ckpt, shards=shards,
                        optimizer=optimizer, accumulate=accumulate, fsdp=fsdp, workspace=workspace)
           for ckpt in (False, True)}
    strategies = {name: memory(shape, batch_size=batch_size, precision=precision, checkpointing=ckpt,
                               shards=devices if sharded else 1, optimizer=optimizer, accumulate=accumulate,
                               fsdp=sharded, workspace=workspace).peak
                  for name, sharded, ckpt in STRATEGIES if devices > 1 or not sharded}
    wall = (run_flops / measured_flops if measured_flops else
            run_flops / (devices * peak_flops * mfu) if peak_flops else None)
    return Plan(
        params=n, non_embedding_params=n - embeddings, flops_per_token=per_token, tokens_per_step=tokens_per_step,
        max_steps=max_steps, tokens=tokens, run_flops=run_flops, tokens_per_param=tokens / n,
        chinchilla_flops=6.0 * n * tokens,
        optimal_params=n_opt, optimal_tokens=d_opt, precision=precision, devices=devices, memory=mem[False],
        memory_checkpointed=mem[True], gpu=gpu, peak_flops=peak_flops, mfu=mfu, wall_seconds=wall,
        measured_flops=measured_flops, rate=rate, step_seconds=wall / max_steps if wall is not None else None,
        strategies=strategies,
    )


def fits_on(p: Plan, device_memory: int) -> str | None:
    """The first of ``p.strategies`` (fastest first) whose peak fits ``device_memory`` bytes per device, or None."""
    return next((name for name, peak in (p.strategies or {}).items() if peak <= device_memory), None)


# ---- the picture: `tinylm plan --out PNG` ------------------------------------------------------------------------
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "workspace")  # stacking order, bottom up


def short_count(x: float) -> str:
    """3 significant digits with a unit: 12.3M, 1.23B, 4.56T."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def memory_in_name(gpu: str) -> int | None:
    """Bytes of memory a GPU's name states ("NVIDIA H100 80GB HBM3", "A100-SXM4-40GB" -> 80 / 40 GiB: vendors' GB
    of HBM and GDDR are binary), or None when the name states none ("H100", "cpu"): tinylm keeps no table of
    memory sizes, so a short name draws no memory line rather than a guessed one."""
    import re

    found = re.search(r"(\d+(?:\.\d+)?)\s*GB\b", gpu, flags=re.IGNORECASE)
    return int(float(found.group(1)) * 2**30) if found else None


def memory_bars(p: Plan) -> dict[str, dict[str, int]]:
    """{bar: {part: bytes per device}} of the memory panel, parts in MEMORY_PARTS order: the same Memory values
    the table prints, without and with activation checkpointing (the cuBLAS workspaces only where the peak counts
    them: a GPU plan)."""
    bars = {"no checkpointing": p.memory, "activation checkpointing": p.memory_checkpointed}
    parts = [part for part in MEMORY_PARTS if part != "workspace" or p.memory.workspace]
    return {label: {part: getattr(m, part) for part in parts} for label, m in bars.items()}


def frontier_points(p: Plan) -> dict[str, tuple[float, float]]:
    """(parameters N, tokens D) of this run and of the compute-optimal model for the same FLOPs, as the table
    states them. Both lie on the run's isoFLOP line 6ND = C."""
    return {"run": (float(p.params), float(p.tokens)), "optimal": (p.optimal_params, p.optimal_tokens)}


def draw_plan(fig, p: Plan, *, device_memory: int | None = None, title: str = "") -> None:
    """Two panels on ``fig``: memory per device as stacked bars (the peak marked, the device's memory as a line
    when known), and the run's (N, D) against Chinchilla's frontier D = 20 N and the budget's isoFLOP line."""
    import numpy as np

    mem_ax, chin_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    bars = memory_bars(p)
    peaks = [p.memory.peak, p.memory_checkpointed.peak]
    top = max([*peaks, *(sum(b.values()) for b in bars.values()), device_memory or 0])
    unit, scale, digits = ("GiB", 2**30, 2) if top >= 2**30 else ("MiB", 2**20, 1)  # as the table prints them
    xs = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    parts = list(bars["no checkpointing"])
    for i, part in enumerate(parts):
        values = np.array([b[part] for b in bars.values()]) / scale
        mem_ax.bar(xs, values, 0.55, bottom=bottom, color=f"C{i}", label=part)
        bottom += values
    # one step: the backward pass frees activations as it makes gradients, so the stack overcounts; under
    # accumulation the summed gradients stay beside the next micro-batch's activations, and the peak tops the stack
    why = ("gradients and activations\nare never all alive at once"
           if p.memory.peak < sum(bars["no checkpointing"].values())
           else "accumulated gradients stay\nbeside the activations")
    for x, peak in zip(xs, peaks):
        mem_ax.plot([x - 0.35, x + 0.35], [peak / scale] * 2, color="black", lw=2,
                    label=f"peak ({why})" if x == 0 else None)
        mem_ax.annotate(f"{peak / scale:.{digits}f} {unit}", (x + 0.36, peak / scale), va="center", fontsize=8)
    if device_memory:
        mem_ax.axhline(device_memory / scale, color="C3", ls="--", label=f"{p.gpu}: {device_memory / scale:.3g} {unit}")
    mem_ax.set_xticks(xs, list(bars))
    mem_ax.set_xlim(-0.6, len(bars) - 0.1)
    mem_ax.set_ylim(0, top / scale * 1.5)  # room above the bars (and the device's line) for the legend
    mem_ax.set_ylabel(f"memory per device ({unit})")
    mem_ax.set_title(f"memory per device, {p.precision}", fontsize=10)
    mem_ax.grid(alpha=0.3, axis="y")
    by_label = dict(zip(*reversed(mem_ax.get_legend_handles_labels())))
    order = [*reversed(parts), *(k for k in by_label if k not in parts)]  # as stacked, top down
    mem_ax.legend([by_label[k] for k in order], order, fontsize=7, loc="upper center", ncols=2)

    points = frontier_points(p)
    (n_run, d_run), (n_opt, d_opt) = points["run"], points["optimal"]
    ns = np.geomspace(min(n_run, n_opt) / 10, max(n_run, n_opt) * 10, 100)
    chin_ax.plot(ns, p.chinchilla_flops / (6 * ns), color="C0", label=f"this run's C = 6ND = {p.chinchilla_flops:.3g}")
    chin_ax.plot(ns, CHINCHILLA_TOKENS_PER_PARAM * ns, color="C2", ls="--",
                 label=f"Chinchilla compute-optimal: D = {CHINCHILLA_TOKENS_PER_PARAM:.0f} N")
    chin_ax.plot([n_opt], [d_opt], "*", color="C2", ms=14,
                 label=f"optimal: {short_count(n_opt)} params, {short_count(d_opt)} tokens")
    chin_ax.plot([n_run], [d_run], "o", color="C3", ms=8,
                 label=f"this run: {short_count(n_run)} params, {short_count(d_run)} tokens "
                       f"({p.tokens_per_param:.3g} tokens/param)")
    chin_ax.set_xscale("log")
    chin_ax.set_yscale("log")
    chin_ax.set_xlabel("parameters N")
    chin_ax.set_ylabel("training tokens D")
    chin_ax.set_title("this run against Chinchilla's compute-optimal frontier", fontsize=10)
    chin_ax.grid(alpha=0.3, which="both")
    chin_ax.legend(fontsize=7, loc="upper right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()


def plot_plan(p: Plan, out: str | Path, *, device_memory: int | None = None, title: str = "") -> Path:
    """`draw_plan` into the PNG ``out`` (its folder is made if missing)."""
    from tinylm.studies.plots import figure_canvas, save_png

    fig, canvas = figure_canvas(figsize=(12, 4.8))
    draw_plan(fig, p, device_memory=device_memory, title=title)
    return save_png(canvas, out)
