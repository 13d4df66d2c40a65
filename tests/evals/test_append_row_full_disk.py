"""validate's and eval's CSV rows on a full disk: whole or not at all, the earlier rows kept."""
import csv
import errno

import pytest

from tinylm.evals import results
from tinylm.evals.results import append_row


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_a_failed_append_leaves_no_half_row(tmp_path, monkeypatch):
    path = tmp_path / "validate" / "metrics.csv"
    append_row(path, {"step": 1, "val/loss": 3.5})
    before = path.read_bytes()

    real = csv.DictWriter.writerow

    def writerow(self, row):
        f = self._tinylm_file
        f.write("2,3.")
        f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    orig_init = csv.DictWriter.__init__

    def init(self, f, *a, **k):
        orig_init(self, f, *a, **k)
        self._tinylm_file = f

    monkeypatch.setattr(csv.DictWriter, "__init__", init)
    monkeypatch.setattr(csv.DictWriter, "writerow", writerow)
    with pytest.raises(OSError):
        append_row(path, {"step": 2, "val/loss": 3.4})
    assert path.read_bytes() == before
    monkeypatch.setattr(csv.DictWriter, "writerow", real)
    append_row(path, {"step": 3, "val/loss": 3.3})
    assert [r["step"] for r in _rows(path)] == ["1", "3"]
    assert not (path.parent / "metrics.csv.tmp").exists()


def test_a_row_cut_by_a_kill_is_dropped_before_the_next(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,val/loss\n1,3.5\n2,3.", encoding="utf-8")
    append_row(path, {"step": 3, "val/loss": 3.3})
    assert _rows(path) == [{"step": "1", "val/loss": "3.5"}, {"step": "3", "val/loss": "3.3"}]


def test_a_row_cut_by_a_kill_is_dropped_when_a_new_column_rewrites_the_file(tmp_path):
    """Catches the half row kept by the rewrite that widens the header: step 2's cut "3." (of 3.4) was recorded as
    its loss."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,val/loss\n1,3.5\n2,3.", encoding="utf-8")
    append_row(path, {"step": 3, "val/loss": 3.3, "val/bpb": 1.2})
    assert _rows(path) == [{"step": "1", "val/loss": "3.5", "val/bpb": ""},
                           {"step": "3", "val/loss": "3.3", "val/bpb": "1.2"}]


def test_a_failed_rewrite_leaves_no_tmp(tmp_path, monkeypatch):
    path = tmp_path / "metrics.csv"

    def replace(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "replace", replace)
    with pytest.raises(OSError):
        append_row(path, {"step": 1})
    assert list(tmp_path.iterdir()) == []
