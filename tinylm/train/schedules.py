"""Learning-rate schedules as pure functions of the optimizer step.

Each returns the learning rate for optimizer step ``step`` (0-based: the rate used by the first update is
``lr_at(0)``). They are stepped once per *optimizer* step, so ``accumulate_grad_batches`` neither stretches nor
shrinks them. Worked example, warmup-cosine with lr=1e-3, min_lr=1e-4, warmup=10, decay=100::

    step 0   -> 1e-3 * 1/11          (warmup starts above zero: the first update still moves the weights)
    step 10  -> 1e-3                 (end of warmup, peak)
    step 55  -> 5.5e-4               (halfway down the cosine: min + (max - min) / 2)
    step 100 -> 1e-4 and stays there (min_lr after decay_steps)
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "wsd", "constant")


def _warmup(step: int, lr: float, warmup_steps: int) -> float | None:
    """The warmup rate at ``step``, or None once warmup is over."""
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    return None


def warmup_cosine(step: int, *, lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, cosine decay to ``min_lr`` at ``decay_steps``, then flat."""
    if (w := _warmup(step, lr, warmup_steps)) is not None:
        return w
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, decay_steps - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def warmup_stable_decay(
    step: int, *, lr: float, min_lr: float, warmup_steps: int, decay_steps: int, decay_fraction: float = 0.2
) -> float:
    """WSD: warmup, hold ``lr`` flat, then decay linearly to ``min_lr`` over the last ``decay_fraction`` of the
    steps after warmup."""
    if (w := _warmup(step, lr, warmup_steps)) is not None:
        return w
    # whole stable steps, rounded first: 0.7 * 90 is 62.99999999999999 in floats, and int() made it 62
    decay_start = warmup_steps + int(round((1.0 - decay_fraction) * (decay_steps - warmup_steps), 9))
    if step < decay_start:
        return lr
    if step >= decay_steps:
        return min_lr
    progress = (step - decay_start) / max(1, decay_steps - decay_start)
    return lr + progress * (min_lr - lr)


def constant(step: int, *, lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Warmup, then ``lr`` forever (min_lr and decay_steps are ignored)."""
    w = _warmup(step, lr, warmup_steps)
    return lr if w is None else w


def lr_at(
    step: int, *, schedule: str, lr: float, min_lr: float, warmup_steps: int, decay_steps: int,
    decay_fraction: float = 0.2
) -> float:
    """The learning rate of ``schedule`` (one of SCHEDULES) at optimizer step ``step``."""
    kwargs = {"lr": lr, "min_lr": min_lr, "warmup_steps": warmup_steps, "decay_steps": decay_steps}
    if schedule == "cosine":
        return warmup_cosine(step, **kwargs)
    if schedule == "wsd":
        return warmup_stable_decay(step, decay_fraction=decay_fraction, **kwargs)
    if schedule == "constant":
        return constant(step, **kwargs)
    raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
