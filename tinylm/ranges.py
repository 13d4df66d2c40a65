"""Range checks for numeric options, written as intervals: one helper for every option of every class.

A range is a string in interval notation whose bounds are numbers (``inf``, ``2**64`` allowed) or the name of
another option in the same mapping::

    check_ranges("model", {"dropout": 1.5}, {"dropout": "[0, 1)"})
    # ValueError: model.dropout must be in [0, 1), got 1.5
    check_ranges("model", {"prefix_len": 16, "block_size": 16}, {"prefix_len": "[0, block_size)"})
    # ValueError: model.prefix_len must be in [0, block_size=16), got 16
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Collection, Mapping
from typing import Any

SEED_RANGE = "[0, 2**32)"  # numpy's seeds, which seed_everything sets with torch's and Python's
_INTERVAL = re.compile(r"([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])")


@functools.cache
def _parse(interval: str) -> tuple[bool, str, str, bool]:
    m = _INTERVAL.fullmatch(interval.strip())
    if m is None:
        raise AssertionError(f"not an interval: {interval!r}")  # a typo in tinylm's own range tables
    low_bracket, low, high, high_bracket = m.groups()
    return low_bracket == "(", low, high, high_bracket == ")"


def _bound(token: str, values: Mapping[str, Any]) -> tuple[float, str]:
    """(value, how to print it) of a bound: a number, ``B**E``, or another option's name."""
    if token in values:
        return values[token], f"{token}={values[token]}"
    if "**" in token:
        base, exp = token.split("**")
        return int(base) ** int(exp), token
    return float(token), token


def check_ranges(owner: str, values: Mapping[str, Any], ranges: Mapping[str, str], *,
                 whole: Collection[str] = ()) -> None:
    """Raise ValueError naming the first option of ``ranges`` whose value in ``values`` lies outside its interval.

    owner: the config section the options belong to (``model``, ``data``, ``trainer``), printed as the prefix of
        each name so the message names the command-line option (``model.dropout``); ``"--"`` for a command's own
        flags (``--num_samples``); "" for none.
    values: option name -> value; an option that is missing or None (unset: use the default) is skipped, and so
        is one whose bound names an option that is None.
    ranges: option name -> interval. NaN, bools and non-numbers are out of every range.
    whole: the options that must be whole numbers (counts, ids, seeds): 2.5 is out of their range.
    """
    for name, interval in ranges.items():
        value = values.get(name)
        if value is None:
            continue
        low_open, low, high, high_open = _parse(interval)
        (lo, lo_text), (hi, hi_text) = _bound(low, values), _bound(high, values)
        if lo is None or hi is None:
            continue
        number = isinstance(value, numbers.Integral if name in whole else numbers.Real) and not isinstance(value, bool)
        above = number and (value > lo if low_open else value >= lo)
        below = number and (value < hi if high_open else value <= hi)
        if not (above and below):  # NaN fails both comparisons
            shown = f"{'(' if low_open else '['}{lo_text}, {hi_text}{')' if high_open else ']'}"
            what = "a whole number in" if name in whole else "in"
            prefix = owner if owner.endswith("-") else f"{owner}." if owner else ""
            raise ValueError(f"{prefix}{name} must be {what} {shown}, got {value!r}")
