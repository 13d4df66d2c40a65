"""Scaling laws from a compute-matched ladder: models of several sizes trained on the same FLOPs budget, the fit
L(N) = E + A N^-alpha over them, the compute-optimal size of the budget (Chinchilla's IsoFLOP approach: a parabola
in log N through the losses), and a prediction for a larger model. Pure functions; `tinylm scaling` runs the ladder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tinylm.model import GPT, GPTConfig


@dataclass(frozen=True)
class Rung:
    """One model of the ladder and how long it trains to spend the budget."""

    n_layer: int
    n_embd: int
    n_head: int
    params: int
    flops_per_token: float
    max_steps: int
    warmup_steps: int = 0

    @property
    def label(self) -> str:
        return f"L{self.n_layer}-d{self.n_embd}"


def rung(*, n_layer: int, n_embd: int, head_size: int, budget: float, tokens_per_step: int, warmup_steps: int = 0,
         **shape) -> Rung:
    """The rung of width ``n_embd`` and depth ``n_layer`` (heads of ``head_size``) that spends ``budget`` training
    FLOPs on steps of ``tokens_per_step``; ``shape`` holds the rest of GPTConfig (vocab_size, block_size, bias, ...).
    It warms up for ``warmup_steps`` (the config's), at most a tenth of its steps: a small budget's larger rungs
    would otherwise spend their few steps warming up, at lower LRs than the smaller rungs, and the ladder would
    measure the schedule instead of the size. The model is built on the meta device: counting costs no memory."""
    if n_embd % head_size:
        raise ValueError(f"n_embd {n_embd} is not a multiple of the head size {head_size}; pick a multiple")
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_embd // head_size, **shape))
    per_token = model.flops_per_token()
    steps = round(budget / (per_token * tokens_per_step))  # 0 when the budget buys no step: the caller refuses it
    return Rung(n_layer, n_embd, n_embd // head_size, model.num_params(), per_token, steps,
                min(warmup_steps, steps // 10))


def ladder_time_left(seconds: float, rungs_trained: float, rungs_left: int) -> float | None:
    """Seconds the ladder's ``rungs_left`` unfinished rungs will take, at the rate of ``seconds`` spent training
    ``rungs_trained`` rungs' worth of steps in this process (every rung spends the same FLOPs): a rung resumed at
    step s of n counts (n - s) / n of one, not a whole one. None before any step was timed."""
    if rungs_trained <= 0 or rungs_left <= 0:
        return None
    return seconds / rungs_trained * rungs_left


@dataclass(frozen=True)
class PowerLaw:
    """L(N) = E + A N^-alpha."""

    E: float
    A: float
    alpha: float
    rmse: float  # of the fit over its points, nats

    def __call__(self, n: float) -> float:
        return self.E + self.A * n ** -self.alpha


ALPHAS = (0.01, 2.0)  # the exponents searched: the laws measured for language models lie well inside
GOLDEN = (1 + 5**0.5) / 2


def fit_power_law(params: list[float], losses: list[float]) -> PowerLaw:
    """Least-squares fit of L = E + A N^-alpha with E >= 0 (the irreducible loss: a cross-entropy): for each alpha
    E and A are linear (closed form); alpha is searched on a fine grid over ALPHAS, then refined between the best
    point's neighbours (golden section), so there is no optimiser to start or to diverge. Needs >= 3 points, and
    refuses losses that do not fall with size or fit only at the edge of ALPHAS (they fall and rise again)."""
    if len(params) < 3 or len(params) != len(losses):
        raise ValueError(f"a power-law fit needs >= 3 (size, loss) pairs, got {len(params)} sizes and "
                         f"{len(losses)} losses")
    n, y = np.asarray(params, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    if not (np.isfinite(n).all() and (n > 0).all() and np.isfinite(y).all()):
        raise ValueError(f"a power-law fit needs positive sizes and finite losses, got sizes {list(params)} and "
                         f"losses {list(losses)}")

    def fit(alpha: float) -> tuple[float, float, float]:
        """(squared error, E, A) of the best law with this alpha; an infinite error if it does not fall."""
        x = n ** -alpha
        X = np.stack([np.ones_like(x), x], axis=1)
        (E, A), *_ = np.linalg.lstsq(X, y, rcond=None)
        if E < 0:  # a cross-entropy cannot fall below 0: the best fit with E >= 0 then has E = 0
            E, A = 0.0, float(x @ y / (x @ x))
        if A <= 0:  # loss must fall with size for this law
            return math.inf, 0.0, 0.0
        return float(((X @ np.array([E, A]) - y) ** 2).sum()), float(E), float(A)

    grid = np.linspace(*ALPHAS, 2000)
    errors = [fit(a)[0] for a in grid]
    i = int(np.argmin(errors))
    if math.isinf(errors[i]):
        raise ValueError("the losses do not fall with model size, so no L = E + A N^-alpha fits; the budget may be "
                         "too small for the larger models (raise --budget) or the sizes too close")
    if i in (0, len(grid) - 1):
        raise ValueError(f"the losses fit L = E + A N^-alpha only at the edge of the exponents searched (alpha "
                         f"{grid[i]:g}): they do not fall as a power law (falling, then flat or rising: the larger "
                         "models are past the budget's optimal size); use smaller --sizes or a larger --budget")
    lo, hi = grid[i - 1], grid[i + 1]
    for _ in range(60):  # golden section: the bracket shrinks to ~6e-13 of the grid step
        a, b = hi - (hi - lo) / GOLDEN, lo + (hi - lo) / GOLDEN
        if fit(a)[0] < fit(b)[0]:
            hi = b
        else:
            lo = a
    alpha = (lo + hi) / 2
    if fit(alpha)[0] > errors[i]:  # the error is not unimodal in the bracket (E's clamp at 0): keep the grid's best
        alpha = grid[i]
    sse, E, A = fit(alpha)
    return PowerLaw(E, A, float(alpha), math.sqrt(sse / len(n)))


def isoflop_optimum(params: list[float], losses: list[float]) -> tuple[float, float] | None:
    """(N, L) at the minimum of a parabola in log N through the ladder's losses (Chinchilla, approach 2): the
    compute-optimal size of this budget. None when the losses still fall at the largest size (the optimum lies
    beyond the ladder: the budget favours bigger models than it holds), rise from the smallest (it lies below), or
    the parabola opens downwards. (A parabola through a curve that falls all along, as a power law does, has its
    vertex inside the range as often as not: it named a size below the best rung, at a loss under the law's floor.)"""
    if len(params) < 3:
        return None
    by_size = sorted(range(len(params)), key=lambda i: params[i])
    best = min(by_size, key=lambda i: losses[i])
    if best in (by_size[0], by_size[-1]):  # the measured optimum at an end: the minimum is outside the ladder
        return None
    x = np.log(np.asarray(params, dtype=np.float64))
    a, b, c = np.polyfit(x, np.asarray(losses, dtype=np.float64), 2)
    if a <= 0:
        return None
    x_opt = -b / (2 * a)
    if not x.min() <= x_opt <= x.max():
        return None
    return float(math.exp(x_opt)), float(a * x_opt**2 + b * x_opt + c)


def plot_scaling(rungs: list[Rung], losses: list[float], law: PowerLaw | None, *,
                 predicted: tuple[Rung, float | None] | None, budget: float, out) -> None:
    """Log-log plot of the ladder's final validation losses against parameters, the fitted law (None: none fits),
    and the predicted and measured loss of the larger model."""
    from matplotlib.ticker import ScalarFormatter

    from tinylm.studies.plots import figure_canvas, save_png

    fig, canvas = figure_canvas(figsize=(7, 4.5))
    ax = fig.subplots()
    ns = [r.params for r in rungs]
    ax.plot(ns, losses, "o", color="C0", ms=7, label="ladder (final val/loss)")
    for r, loss in zip(rungs, losses):
        ax.annotate(r.label, (r.params, loss), textcoords="offset points", xytext=(4, 4), fontsize=7)
    top = max(ns + ([predicted[0].params] if predicted else []))
    grid = np.geomspace(min(ns) / 1.5, top * 1.5, 100)
    if law is not None:
        ax.plot(grid, [law(n) for n in grid], "--", color="C1",
                label=f"L = {law.E:.3f} + {law.A:.3g}·N^-{law.alpha:.3f}")
    if predicted:
        r, measured = predicted
        if law is not None:
            ax.plot([r.params], [law(r.params)], "D", mfc="none", color="C3", ms=9, label=f"predicted {r.label}")
        if measured is not None:
            said = f" (predicted {law(r.params):.3f})" if law is not None else " (no law fits the ladder)"
            ax.plot([r.params], [measured], "D", color="C3", ms=6, label=f"measured {r.label}: {measured:.3f}{said}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())  # losses span less than a decade: 2.1, not 2.1 x 10^0
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("parameters N")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"compute-matched ladder: {budget:.2g} training FLOPs per model", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(canvas, out)
