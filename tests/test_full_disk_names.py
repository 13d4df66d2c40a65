"""A full disk fails a small write at close, with an OSError that names no file: each write names its own."""
import errno
from pathlib import Path

import pytest


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as close() raises it: no file name


def test_tokenizer_save_names_the_file(tmp_path, monkeypatch):
    from tinylm.tokenize import build_tokenizer

    tok = build_tokenizer("char", documents=lambda: ["hello world"])
    monkeypatch.setattr(Path, "write_text", _full)
    with pytest.raises(OSError) as e:
        tok.save(tmp_path / "tok")
    assert e.value.filename == str(tmp_path / "tok" / "tinylm_tokenizer.json")


def test_metrics_csv_names_the_file(tmp_path, monkeypatch):
    import csv

    from tinylm.train.loggers import RunCSVLogger

    logger = RunCSVLogger(tmp_path)
    logger.log_metrics({"train/loss": 4.1}, step=0)
    monkeypatch.setattr(csv.DictWriter, "writerows", _full)
    with pytest.raises(OSError) as e:
        logger.save()
    assert e.value.filename == str(tmp_path / "csv" / "metrics.csv")
