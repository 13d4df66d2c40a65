"""The one writer of result rows (`runs/NAME/eval/metrics.csv`, `runs/NAME/validate/metrics.csv`)."""

import csv
import os

import forked

from tinylm.evals.results import append_row


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_two_commands_appending_at_once_keep_every_row_and_one_header(tmp_path):
    """Catches two `tinylm validate` of one run finishing together without taking turns: both wrote a header, or
    one's rewrite (a row with a new column widens the file by a rename) dropped rows the other had appended."""
    path = tmp_path / "validate" / "metrics.csv"
    r, w = os.pipe()
    children = []
    for name in ("a", "b"):
        pid = os.fork()
        if pid == 0:  # each waits for the start, then appends 60 rows; b's every 10th row adds a column
            try:
                os.close(w)
                os.read(r, 1)
                for i in range(60):
                    extra = {f"val/{name}{i}": 1.0} if name == "b" and i % 10 == 0 else {}
                    append_row(path, {"who": name, "i": i, **extra})
            finally:
                os._exit(0)
        children.append(pid)
    os.close(r)
    os.write(w, b"go")  # one byte each: both start together
    os.close(w)
    for pid in children:
        assert forked.reap(pid) == 0
    rows = _rows(path)
    assert sorted((row["who"], int(row["i"])) for row in rows) == sorted((n, i) for n in "ab" for i in range(60))
    assert path.read_text().count("who,i") == 1
