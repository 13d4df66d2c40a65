"""Building blocks the GPT's options choose between: norms (LayerNorm, RMSNorm), MLPs (GELU, SwiGLU, ReLU²) and
rotary position embeddings (RoPE). Shape letters as in gpt.py; H is the MLP's hidden width."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

RMS_NORM_EPS = 1e-6  # Llama's rms_norm_eps; written into the exported config, so both compute the same


def at_least_fp32(x: Tensor) -> Tensor:
    """x in fp32 when it is in a 16-bit float type (autocast's bf16 activations), else x itself (fp32, fp64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _as_dtype(y: Tensor, dtype: torch.dtype) -> Tensor:
    """y in ``dtype``, without a no-op ``.to``: torch 2.11's torch.compile gives an autograd.Function whose forward
    returns ``y.to(dtype)`` of y's own dtype a zero gradient (eager and torch >= 2.13 are right)."""
    return y if y.dtype == dtype else y.to(dtype)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = RMS_NORM_EPS) -> Tensor:
    """x / rms(x) over the last dimension (in fp32, as Llama does), times an optional gain.

    One autograd node with a hand-written backward (`_RMSNormFn`): on CPU, where nothing fuses elementwise ops, the
    ~12 passes over x of the composite (pow, mean, rsqrt, two muls and their backwards) cost more than LayerNorm's
    fused kernel; this takes ~7 (benchmarks/bench_modern.py --ops measures both)."""
    return _RMSNormFn.apply(x, weight, eps)


class _RMSNormFn(torch.autograd.Function):
    """y = x·r·w with r = (mean(x²) + eps)^-1/2. Backward, with ŷ = x·r and gŷ = g·w:
    dx = r·(gŷ - ŷ·mean(gŷ·ŷ)),  dw = Σ g·ŷ over every dimension but the last."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        xf = at_least_fp32(x)
        r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)  # (..., 1)
        y = xf * r  # fp32
        ctx.save_for_backward(y, r, weight)
        return _as_dtype(y if weight is None else y * weight, x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor | None, None]:
        y, r, weight = ctx.saved_tensors
        g = at_least_fp32(grad)
        gy = g if weight is None else g * weight
        dx = torch.addcmul(gy, y, (gy * y).mean(-1, keepdim=True), value=-1).mul_(r)
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = (g * y).sum(dim=tuple(range(g.dim() - 1))).to(weight.dtype)
        return dx.to(grad.dtype), dw, None


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): LayerNorm without the mean subtraction and the bias; a learned gain."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight)


def make_norm(kind: str, dim: int, *, bias: bool) -> nn.Module:
    """The residual-stream norm: nn.LayerNorm (nanoGPT; with a bias when `bias`) or RMSNorm."""
    return nn.LayerNorm(dim, bias=bias) if kind == "layernorm" else RMSNorm(dim)


def swiglu_hidden(n_embd: int) -> int:
    """SwiGLU's hidden width: 8/3·C rounded to a multiple of 64 (at least 64), so its three matrices hold about as
    many parameters as the GELU MLP's two of width 4C (3·C·8C/3 = 8C²); C = 384 gives 1024, C = 768 gives 2048.
    Below C ~128 the rounding swings it either way (C = 32: 0.75x the GELU MLP's, C = 64: 1.12x, C = 8: 3x)."""
    return max(64, round(8 * n_embd / 3 / 64) * 64)


class MLP(nn.Module):
    """The feed-forward branch: `gelu` (nanoGPT: c_proj(gelu(c_fc x)), H = 4C; `gelu_tanh`: GELU's tanh
    approximation, OpenAI's GPT-2's), `relu2` (modded-nanogpt's
    c_proj(relu(c_fc x)²), H = 4C) or `swiglu` (Llama's c_proj(silu(c_gate x) * c_fc x), H = swiglu_hidden(C))."""

    def __init__(self, n_embd: int, *, kind: str = "gelu", bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.kind = kind
        hidden = swiglu_hidden(n_embd) if kind == "swiglu" else 4 * n_embd
        self.c_fc = nn.Linear(n_embd, hidden, bias=bias)
        if kind in ("gelu", "gelu_tanh"):  # a module, as in nanoGPT (the default path's module order as it was)
            self.gelu = nn.GELU(approximate="tanh" if kind == "gelu_tanh" else "none")
        if kind == "swiglu":
            self.c_gate = nn.Linear(n_embd, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)  # (B, T, H)
        if self.kind in ("gelu", "gelu_tanh"):
            h = self.gelu(h)
        elif self.kind == "relu2":
            h = relu_squared(h)
        else:
            h = F.silu(self.c_gate(x)) * h
        return self.dropout(self.c_proj(h))  # (B, T, C)


def relu_squared(x: Tensor) -> Tensor:
    """relu(x)² as one autograd node (`_ReLU2Fn`): keeps relu(x) only, backward 2·relu(x)·g (the composite keeps
    x and relu(x) and takes four passes back)."""
    return _ReLU2Fn.apply(x)


class _ReLU2Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (r,) = ctx.saved_tensors
        return (r * grad).mul_(2)


def rope_cos_sin(positions: Tensor, head_size: int, theta: float,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin (T, hs) of rotary embeddings for absolute `positions` (T,), in fp32 (``dtype``: float64 for a
    float64 model) and in Llama's layout: pair i is (x[i], x[i + hs/2]) and turns by position · theta^(-2i/hs)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, device=positions.device, dtype=dtype) / head_size)
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]  # (T, hs/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hs): both halves of each pair turn by the same angle
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys x (..., hs) by their positions' angles (cos and sin broadcast against x, e.g. (T, hs)
    for x (B, nh, T, hs)); q·k then depends on positions only through their difference, which is why cached keys
    stay valid when new tokens arrive. One autograd node (`_RoPEFn`): the backward of a rotation is the rotation
    back, so no intermediate is kept."""
    return _RoPEFn.apply(x, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin in fp32, as half-width products: for the pair (a, b) at angle θ,
    (a cos θ - b sin θ, b cos θ + a sin θ). cos and sin hold the same angles in both halves. Functional (no
    in-place writes into views), so torch.compile traces it."""
    h = x.size(-1) // 2
    x = at_least_fp32(x)
    x1, x2, c, s = x[..., :h], x[..., h:], cos[..., :h], sin[..., :h]
    return torch.cat([torch.addcmul(x1 * c, x2, s, value=-1), torch.addcmul(x2 * c, x1, s)], dim=-1)


class _RoPEFn(torch.autograd.Function):
    """y = R(θ)x per pair of channels; dx = R(θ)ᵀg = R(-θ)g (cos and sin are constants: no gradient)."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return _as_dtype(_rotate(x, cos, sin), x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin).to(grad.dtype), None, None
