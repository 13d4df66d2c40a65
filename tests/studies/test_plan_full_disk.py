"""plan's numbers and picture on a full disk: the earlier ones whole, none half-written, the file named."""
import errno
import json
from pathlib import Path

import pytest

from tinylm.cli import main


def test_a_plan_on_a_full_disk_can_be_run_again(run_config, tmp_path, monkeypatch, capsys):
    """Catches `tinylm plan --out` on a full disk leaving an empty plan.json, which the same command, run again
    once space was freed, refused as "another file"."""
    pytest.importorskip("matplotlib")
    cfg = run_config()
    png = tmp_path / "plan.png"
    real = Path.write_text

    def full(self, text, *args, **kwargs):  # the file is made, then the disk is full
        real(self, "", *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg), "--gpu", "cpu", "--out", str(png)])
    assert str(png.with_suffix(".json")) in capsys.readouterr().err
    monkeypatch.setattr(Path, "write_text", real)
    assert sorted(p.name for p in tmp_path.glob("plan*")) == []
    main(["plan", "--config", str(cfg), "--gpu", "cpu", "--out", str(png)])
    assert json.loads(png.with_suffix(".json").read_text())["params"] > 0
