"""Building blocks the GPT's options choose between: norms (LayerNorm, RMSNorm), MLPs (GELU, SwiGLU, ReLU²) and
rotary position embeddings (RoPE). Shape letters as in gpt.py; H is the MLP's hidden width."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

RMS_NORM_EPS = 1e-6  # Llama's rms_norm_eps; written into the exported config, so both compute the same


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = RMS_NORM_EPS) -> Tensor:
    """x / rms(x) over the last dimension (in fp32, as Llama does), times an optional gain."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else weight * y


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
    many parameters as the GELU MLP's two of width 4C (3·C·8C/3 = 8C²); C = 384 gives 1024, C = 768 gives 2048."""
    return max(64, round(8 * n_embd / 3 / 64) * 64)


class MLP(nn.Module):
    """The feed-forward branch: `gelu` (nanoGPT: c_proj(gelu(c_fc x)), H = 4C), `relu2` (modded-nanogpt's
    c_proj(relu(c_fc x)²), H = 4C) or `swiglu` (Llama's c_proj(silu(c_gate x) * c_fc x), H = swiglu_hidden(C))."""

    def __init__(self, n_embd: int, *, kind: str = "gelu", bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.kind = kind
        hidden = swiglu_hidden(n_embd) if kind == "swiglu" else 4 * n_embd
        self.c_fc = nn.Linear(n_embd, hidden, bias=bias)
        if kind == "gelu":
            self.gelu = nn.GELU()  # a module, as in nanoGPT (and the default path's module order stays as it was)
        if kind == "swiglu":
            self.c_gate = nn.Linear(n_embd, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)  # (B, T, H)
        if self.kind == "gelu":
            h = self.gelu(h)
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            h = F.silu(self.c_gate(x)) * h
        return self.dropout(self.c_proj(h))  # (B, T, C)


def rope_cos_sin(positions: Tensor, head_size: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin (T, hs) of rotary embeddings for absolute `positions` (T,), in fp32 and in Llama's layout: pair i
    is (x[i], x[i + hs/2]) and turns by angle position · theta^(-2i/hs)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, device=positions.device).float() / head_size)  # (hs/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, hs/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hs): both halves of each pair turn by the same angle
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys x (B, nh, T, hs) by their positions' angles; q·k then depends on positions only
    through their difference, which is why cached keys stay valid when new tokens arrive."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, nh, T, hs/2) each
    rotated = torch.cat([-x2, x1], dim=-1)  # for the pair (a, b): (-b, a)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
