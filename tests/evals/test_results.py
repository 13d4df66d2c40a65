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


def test_a_checkpoint_named_in_bytes_not_utf8_is_recorded_by_its_bytes(tmp_path):
    """Catches `tinylm validate` (or `tinylm eval`) of a checkpoint named in bytes that are not UTF-8 (`caf\\xe9.ckpt`,
    Latin-1) recording nothing: "could not append the result to .../validate/metrics.csv ('utf-8' codec can't encode
    character '\\udce9' ...)". The name is recorded by its bytes (`caf\\xe9.ckpt`), and a UTF-8 name Python read
    under the C locale (`caf\\udcc3\\udca9.ckpt`) as itself."""
    path = tmp_path / "validate" / "metrics.csv"
    append_row(path, {"checkpoint": os.fsdecode(b"caf\xe9.ckpt"), "step": 2})
    append_row(path, {"checkpoint": b"caf\xc3\xa9.ckpt".decode("ascii", "surrogateescape"), "step": 3})
    append_row(path, {"checkpoint": "\ud800", "step": 4})
    assert [(row["checkpoint"], row["step"]) for row in _rows(path)] == \
        [("caf\\xe9.ckpt", "2"), ("caf\u00e9.ckpt", "3"), ("\\ud800", "4")]
