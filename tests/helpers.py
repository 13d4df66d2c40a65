"""Helpers shared by test files of several folders: a run's logged rows, a command's one error line, and the
KV cache's logits against the uncached model's, and whether a file system swaps two paths in one step."""

import csv
import re
import shutil
from pathlib import Path

import pytest
import torch

from tinylm.cli import main


def _losses(run_dir: Path, key: str = "train/loss") -> dict[int, list[float]]:
    """``key``'s rows by logged step, in order."""
    out: dict[int, list[float]] = {}
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get(key):
                out.setdefault(int(row["step"]), []).append(float(row[key]))
    return out


def _val_losses(run_dir: Path) -> dict[int, list[float]]:
    return _losses(run_dir, "val/loss")


def _assert_same_rows(got: dict[int, list[float]], want: dict[int, list[float]]) -> None:
    assert sorted(got) == sorted(want)  # no step lost or logged twice
    for step, values in want.items():
        assert got[step] == pytest.approx(values, abs=1e-4), f"step {step}"


def _one_line_error(capsys, argv: list[str], *needles: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err
    # (paths left out: a line naming a folder such as /tmp/errors/... is no error line)
    errors = [line for line in err.splitlines() if "error" in re.sub(r"/\S+", "", line).lower()]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def assert_cached_logits_equal_uncached(model, ids: "torch.Tensor", steps: int = 14) -> None:
    """Greedy-extend ``ids`` (prompts of 6 tokens) ``steps`` times, the next-token logits with the KV cache equal to
    those without it (1e-5) at every step, past block_size (the window then slides)."""
    from tinylm.generate.rows import _Runner

    cached, uncached = _Runner(model, use_cache=True, prompt_len=6), _Runner(model, use_cache=False, prompt_len=6)
    with torch.no_grad():
        for _ in range(steps):
            a, b = cached(ids)[0], uncached(ids)[0]
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            ids = torch.cat([ids, a.argmax(-1, keepdim=True)], dim=1)
    assert ids.size(1) > model.config.block_size


def exchanges(folder: Path) -> bool:
    """Whether the file system of ``folder`` swaps a folder and a file in one step (tinylm.paths.exchange: what a
    save over a checkpoint of the other form does; Linux's local file systems do): then no save leaves a checkpoint's
    name empty, even for an instant."""
    from tinylm.paths import exchange

    probe = folder / "exchange-probe"
    (probe / "folder").mkdir(parents=True)
    (probe / "file").touch()
    try:
        return exchange(probe / "folder", probe / "file")
    finally:
        shutil.rmtree(probe)
