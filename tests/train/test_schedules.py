import itertools
import math

import pytest

from tinylm.train.schedules import constant, lr_at, warmup_cosine, warmup_stable_decay

KW = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "decay_steps": 100}


def test_warmup_cosine_known_values():
    """Catches off-by-one warmup, a cosine that misses its midpoint, and decay that undershoots min_lr."""
    assert warmup_cosine(0, **KW) == pytest.approx(1e-3 / 11)  # never zero: the first step must move weights
    assert warmup_cosine(9, **KW) == pytest.approx(1e-3 * 10 / 11)
    assert warmup_cosine(10, **KW) == pytest.approx(1e-3)
    assert warmup_cosine(55, **KW) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert warmup_cosine(100, **KW) == pytest.approx(1e-4)
    assert warmup_cosine(10_000, **KW) == pytest.approx(1e-4)


def test_warmup_cosine_is_monotone_after_warmup():
    """Catches a schedule that rises again (a sign flip in the cosine) after the peak."""
    values = [warmup_cosine(s, **KW) for s in range(10, 120)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert values[0] > values[-1]


def test_wsd_holds_then_decays_linearly():
    """Catches WSD decaying too early or not reaching min_lr at the end."""
    # decay starts at 10 + 0.8 * 90 = 82
    assert warmup_stable_decay(50, **KW) == pytest.approx(1e-3)
    assert warmup_stable_decay(81, **KW) == pytest.approx(1e-3)
    assert warmup_stable_decay(91, **KW) == pytest.approx(1e-3 + 0.5 * (1e-4 - 1e-3))
    assert warmup_stable_decay(100, **KW) == pytest.approx(1e-4)


def test_constant_after_warmup():
    """Catches the constant schedule decaying."""
    assert constant(5, **KW) == pytest.approx(1e-3 * 6 / 11)
    assert constant(500, **KW) == pytest.approx(1e-3)


def test_zero_warmup_starts_at_peak():
    """Catches a division by zero or a zero learning rate when warmup is off."""
    kw = dict(KW, warmup_steps=0)
    assert warmup_cosine(0, **kw) == pytest.approx(1e-3)
    assert math.isfinite(warmup_stable_decay(0, **kw))


def test_unknown_schedule_names_the_choices():
    """Catches a typo in lr_schedule silently falling back to some default."""
    with pytest.raises(ValueError, match="cosine, wsd, constant"):
        lr_at(0, schedule="cosin", **KW)


def test_constant_schedule_needs_no_length():
    """`constant` ignores decay_steps, so a module with neither max_steps nor decay_steps still has an LR; the
    others say what they need."""
    from tinylm.train.module import TinyLM

    kwargs = {"vocab_size": 16, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8, "warmup_steps": 0}
    assert TinyLM(lr_schedule="constant", lr=2e-3, **kwargs).lr_now() == 2e-3
    with pytest.raises(ValueError, match="the LR schedule needs a length"):
        TinyLM(lr_schedule="cosine", **kwargs).lr_now()


def test_wsd_decay_fraction_sets_where_the_decay_starts():
    """Catches decay_fraction ignored (the default 0.2 used), inverted (decaying over 1 - fraction) or measured
    from step 0 instead of the end of warmup, in the schedule, in lr_at and in the module. Warmup 10, decay_steps
    110: 100 steps after warmup, so fraction 0.25 decays over the last 25 (from step 85), linearly to min_lr."""
    from tinylm.train.module import TinyLM

    kw = dict(KW, decay_steps=110)
    assert warmup_stable_decay(84, decay_fraction=0.25, **kw) == pytest.approx(1e-3)  # still flat
    assert warmup_stable_decay(95, decay_fraction=0.25, **kw) == pytest.approx(1e-3 - 0.4 * 9e-4)  # 10/25 down
    assert warmup_stable_decay(110, decay_fraction=0.25, **kw) == pytest.approx(1e-4)
    assert warmup_stable_decay(109, decay_fraction=0.0, **kw) == pytest.approx(1e-3)  # no decay at all
    assert warmup_stable_decay(110, decay_fraction=0.0, **kw) == pytest.approx(1e-4)
    assert warmup_stable_decay(60, decay_fraction=1.0, **kw) == pytest.approx(5.5e-4)  # decays from step 10: 50/100
    assert lr_at(95, schedule="wsd", decay_fraction=0.25, **kw) == pytest.approx(6.4e-4)
    module = TinyLM(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8, lr_schedule="wsd", lr=1e-3,
                    min_lr=1e-4, warmup_steps=10, decay_steps=110, decay_fraction=0.25)
    assert module._lr_at(95) == pytest.approx(6.4e-4) and module._lr_at(84) == pytest.approx(1e-3)


def test_wsd_decay_fraction_of_a_whole_number_of_steps_is_that_many_steps():
    """Catches the stable phase's length taken by int() of a float product: 0.7 x 90 is 62.99999999999999 in floats,
    so decay_fraction 0.3 of the 90 steps after warmup decayed from step 72 over 28 steps, not from 73 over 27."""
    kw = dict(KW, warmup_steps=10, decay_steps=100)
    assert warmup_stable_decay(73, decay_fraction=0.3, **kw) == 1e-3  # 10 + 63 stable steps: the decay starts here
    assert warmup_stable_decay(74, decay_fraction=0.3, **kw) == pytest.approx(1e-3 - 9e-4 / 27)  # 1/27 of the way
    assert warmup_stable_decay(77, decay_fraction=0.25, **kw) == 1e-3  # 67.5 stable steps: 67 whole ones, as before
    assert warmup_stable_decay(78, decay_fraction=0.25, **kw) < 1e-3
