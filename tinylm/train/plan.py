"""What a run costs before it runs: parameters, FLOPs, tokens, Chinchilla's compute-optimal size, memory per device
and wall time on a named GPU. Pure functions of the model and the run's settings; `tinylm plan` prints them.

Memory model (per device, bytes; checked against measured peaks in docs/benchmarks.md):
    weights    N x 4 (fp32 master weights; 2 under bf16-true), plus a 16-bit copy of every matrix under *-mixed
               (autocast caches the cast weights for the backward pass)
    gradients  N x the weights' element size
    optimizer  AdamW's exp_avg and exp_avg_sq: 2 x N x the weights' element size
    activations what autograd saves for backward per layer and token: 17 x n_embd values, 2 of them in the fp32
               residual stream (the LayerNorm inputs), 15 in the compute dtype (the Linear inputs, q, k, v, the
               attention output, the GELU input and output: 1+1+3+1+1+1+4+4); SDPA's fused kernels keep no T x T
               matrix. Plus the head: three B x T x V fp32 tensors are alive at once (the logits or their
               copy, the log-softmax, and in the backward pass the gradients of both).
               With activation checkpointing: one block input per layer, plus one block recomputed at a time.
    peak       weights + optimizer + the larger of (activations + the tied embedding's gradient) and gradients:
               the backward pass frees a layer's activations as it makes that layer's gradients (and Lightning
               sets gradients to None before each backward), so the two are never all alive at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinylm.model import GPT

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022: compute-optimal D ~ 20 N


@dataclass(frozen=True)
class Memory:
    """Bytes per device."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    peak: int


@dataclass(frozen=True)
class Plan:
    """Everything `tinylm plan` reports about one run."""

    params: int  # total, the tied embedding once, the position table included
    non_embedding_params: int  # without the token and position tables
    flops_per_token: float  # training (forward + backward): 6N + the attention term
    tokens_per_step: int  # micro-batch x accumulation x devices x block_size
    max_steps: int
    tokens: int  # tokens_per_step x max_steps
    run_flops: float  # flops_per_token x tokens (~ 6 N D)
    tokens_per_param: float
    optimal_params: float  # Chinchilla: the size whose 20 tokens/param spend run_flops
    optimal_tokens: float
    precision: str
    devices: int
    memory: Memory
    memory_checkpointed: Memory  # with model.activation_checkpointing
    gpu: str
    peak_flops: float | None  # dense FLOP/s of one `gpu` at `precision`
    mfu: float
    wall_seconds: float | None  # run_flops / (devices x peak x mfu)

    def as_dict(self) -> dict:
        return asdict(self)


def compute_optimal(flops: float) -> tuple[float, float]:
    """(N, D) that spend ``flops`` = 6 N D with D = 20 N (Chinchilla's rule of thumb)."""
    n = (flops / (6.0 * CHINCHILLA_TOKENS_PER_PARAM)) ** 0.5
    return n, CHINCHILLA_TOKENS_PER_PARAM * n


def element_sizes(precision: str) -> tuple[int, int]:
    """(bytes per weight/gradient/optimizer value, bytes per activation in the compute dtype) for a Lightning
    precision string."""
    precision = str(precision)
    if precision.endswith("-true") and ("16" in precision):
        return 2, 2
    if "16" in precision:  # 16-mixed / bf16-mixed: fp32 weights, 16-bit matmuls
        return 4, 2
    if precision.startswith("64"):
        return 8, 8
    return 4, 4


def memory(model: GPT, *, batch_size: int, precision: str, checkpointing: bool, shards: int = 1) -> Memory:
    """Bytes per device of one training step of ``model`` on micro-batches of ``batch_size`` x block_size tokens.

    shards: devices the weights, gradients and optimizer states are split over (FSDP); 1 for DDP / one device.
    """
    c = model.config
    n = model.num_params()
    state, act = element_sizes(precision)
    mixed = state != act
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    weights = n * state // shards + (matrices * act if mixed else 0)
    gradients = n * state // shards
    optimizer = 2 * n * state // shards
    tokens = batch_size * c.block_size
    resid = max(state, act)  # the residual stream stays fp32 under autocast
    per_layer = tokens * c.n_embd * (2 * resid + 15 * act)  # what one block saves for backward
    head = 3 * tokens * c.padded_vocab_size * 4  # fp32: the log-softmax, its gradient and the logits' gradient
    stream = tokens * c.n_embd * resid  # the input of the final LayerNorm / a checkpointed block
    if checkpointing:
        layers = c.n_layer * stream + per_layer  # block inputs + the one block being recomputed
    else:
        layers = c.n_layer * per_layer
    activations = layers + stream + head
    embedding_grad = c.padded_vocab_size * c.n_embd * state  # the first gradient the backward pass makes
    peak = weights + optimizer + max(activations + embedding_grad, gradients)
    return Memory(weights, gradients, optimizer, activations, peak)


def plan(model: GPT, *, batch_size: int, accumulate: int, devices: int, max_steps: int, precision: str,
         gpu: str, mfu: float, peak_flops: float | None, fsdp: bool = False) -> Plan:
    """The plan of a run of ``max_steps`` optimizer steps of ``model``.

    peak_flops: dense FLOP/s of one ``gpu`` at ``precision`` (tinylm.device.peak_flops_by_name), None if unknown.
    """
    c = model.config
    n = model.num_params()
    embeddings = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    per_token = model.flops_per_token()
    tokens_per_step = batch_size * accumulate * devices * c.block_size
    tokens = tokens_per_step * max_steps
    run_flops = per_token * tokens
    n_opt, d_opt = compute_optimal(run_flops)
    shards = devices if fsdp else 1
    mem = {ckpt: memory(model, batch_size=batch_size, precision=precision, checkpointing=ckpt, shards=shards)
           for ckpt in (False, True)}
    wall = run_flops / (devices * peak_flops * mfu) if peak_flops else None
    return Plan(
        params=n, non_embedding_params=n - embeddings, flops_per_token=per_token, tokens_per_step=tokens_per_step,
        max_steps=max_steps, tokens=tokens, run_flops=run_flops, tokens_per_param=tokens / n,
        optimal_params=n_opt, optimal_tokens=d_opt, precision=precision, devices=devices, memory=mem[False],
        memory_checkpointed=mem[True], gpu=gpu, peak_flops=peak_flops, mfu=mfu, wall_seconds=wall,
    )
