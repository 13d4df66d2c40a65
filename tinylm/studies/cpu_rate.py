"""How fast this machine's CPU trains a model, measured when `tinylm plan` plans a CPU run (there is no datasheet
peak for a CPU shared with other jobs, and a small model's step is dominated by more than its matmuls).

Two measurements, the first always, the second when it fits in about a second:
    matmul   a (tokens x n_embd) @ (n_embd x 4 n_embd) product in the run's compute dtype, the MLP's shape (at most
             256 x 1024), timed for 0.1 s: the machine's matmul FLOP/s now (its load included)
    steps    2-3 whole training steps of the real model (forward, loss, backward, clipping, tinylm's optimizer) at the
             run's micro-batch and precision, after one untimed step: the step's own FLOP/s, its Python overheads
             included (not Lightning's loop, logging, the loader and callbacks: a run is 1.1-1.4x slower a step, and
             more for a tiny model, whose step those dominate; docs/studies.md)
             Taken when the model is small (states under 1 GiB) and the matmul rate says a step takes under 0.5 s
A plan from `steps` needs no MFU; one from `matmul` alone applies --mfu to it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from tinylm.device import precision_dtypes
from tinylm.model import GPT, GPTConfig, GPTShape

STEP_BUDGET_S = 0.5  # the longest step (by the matmul rate, which overrates small models) that plan times for real
STATE_LIMIT = 2**30  # bytes of weights + gradients + AdamW state above which plan does not build the model


@dataclass(frozen=True)
class CpuRate:
    """Training FLOP/s of this CPU for one model (model.flops_per_token() x tokens per second)."""

    flops_per_second: float
    matmul_flops: float  # the matmul's FLOP/s
    step_seconds: float | None  # a measured training step (None when only the matmul was timed)
    threads: int
    how: str  # what was timed, in words for the plan's table

    @property
    def measured_steps(self) -> bool:
        return self.step_seconds is not None


def matmul_rate(n_embd: int, tokens: int, dtype: torch.dtype, budget_s: float = 0.1) -> tuple[float, str]:
    """(FLOP/s, the product in words) of the MLP's first matmul at this width, capped at 256 tokens x 1024 wide (2.1
    GFLOP, 16 MiB in fp32: a CPU's rate is flat beyond a few hundred rows and columns)."""
    m, k = min(tokens, 256), min(n_embd, 1024)
    n = 4 * k
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b  # (the first call allocates and picks a kernel)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget_s or count < 1:
        a @ b
        count += 1
    return 2 * m * k * n * count / elapsed, f"{m}x{k} @ {k}x{n} {str(dtype).removeprefix('torch.')}"


def _train_steps(model: GPT, *, batch_size: int, precision: str, optimizer: str, clip: float | None,
                 prefix_len: int = 0, budget_s: float = 1.0) -> list[float]:
    """Seconds of each timed training step (one untimed step first: it makes the optimizer's states)."""
    from tinylm.train.module import token_loss
    from tinylm.train.optim import build_optimizer, fused_adamw

    c = model.config
    weights, compute = precision_dtypes(precision)
    model.to(weights).train()
    opt = build_optimizer(model, optimizer=optimizer, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02,
                          muon_momentum=0.95, muon_weight_decay=0.0, fused=fused_adamw(torch.device("cpu")))
    x = torch.randint(0, c.vocab_size, (batch_size, c.block_size))
    y = torch.roll(x, -1, 1)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 4 and (len(times) < 3 or time.perf_counter() - start < budget_s):  # 2 timed, 3 in budget
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=compute, enabled=compute != weights):
            loss = token_loss(model, x, y, prefix_len if c.attn_mask == "prefix" else None)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times[1:]


def measure(config: GPTConfig, *, batch_size: int, precision: str, optimizer: str = "adamw",
            activation_checkpointing: bool = False, clip: float | None = None, mfu: float = 0.4,
            prefix_len: int = 0) -> CpuRate:
    """This CPU's training rate for a model of ``config`` at micro-batch ``batch_size`` (see the module docstring),
    with torch's current thread count."""
    _, compute = precision_dtypes(precision)
    tokens = batch_size * config.block_size
    matmul, shape = matmul_rate(config.n_embd, tokens, compute)
    threads = torch.get_num_threads()
    counted = GPTShape.of(config)  # (counted from one block: any depth in milliseconds)
    per_token, states = counted.flops_per_token(), 16 * counted.num_params()
    if states > STATE_LIMIT or per_token * tokens / matmul > STEP_BUDGET_S:
        return CpuRate(matmul * mfu, matmul, None, threads,
                       f"{matmul / 1e9:.3g} GFLOP/s measured by a {shape} matmul x {mfu:.0%} MFU (--mfu); the "
                       f"model is too large to time a step of it here")
    with torch.device("cpu"):
        model = GPT(config)
    if activation_checkpointing:
        from tinylm.train.module import RecomputedBlock

        for block in model.transformer.h:
            block.__class__ = RecomputedBlock
    times = _train_steps(model, batch_size=batch_size, precision=precision, optimizer=optimizer, clip=clip,
                         prefix_len=prefix_len)
    step = statistics.median(times)
    return CpuRate(per_token * tokens / step, matmul, step, threads,
                   f"the median of {len(times)} training steps of this model at micro-batch {batch_size}, "
                   f"{precision}, timed here")
