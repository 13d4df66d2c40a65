"""tinylm's own calls into jsonargparse use no API it deprecates (the suite ignores DeprecationWarning, so only a
test that turns it into an error sees one): `skip_none` goes in jsonargparse 5.0, and every `tinylm fit` wrote its
config.yaml with it."""

import warnings
from pathlib import Path

from jsonargparse import ArgumentParser

import tinylm
from tinylm.cli.callback_checks import keep_none


def test_dump_keeps_none_without_a_deprecated_keyword():
    parser = ArgumentParser()
    parser.add_argument("--x", type=int | None, default=None)
    cfg = parser.parse_args([])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert parser.dump(cfg, **keep_none()).strip() == "x: null"


def test_no_skip_none_in_tinylm():
    package = Path(tinylm.__file__).parent
    assert [str(p) for p in package.rglob("*.py") if "skip_none=" in p.read_text(encoding="utf-8")] == []
