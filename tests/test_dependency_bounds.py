"""The lower bounds in pyproject.toml are the oldest releases tinylm was seen to work with: a tiny prepare, fit,
resume, validate and generate, and tests/cli, train/test_resume, data/test_data, tokenize and generate/test_sampling,
with that package at its bound and the others at their newest (or their oldest that work). A bound lowered below the
table fails here; so does a bound raised without the table (the table must say why). Nothing is installed."""

import re
from pathlib import Path

from packaging.version import Version

# package: (oldest seen to work, what breaks below it)
OLDEST = {
    "torch": ("2.3", "GPT.forward calls torch.compiler.is_compiling; 2.3.1 ran the smoke run eager (compile_model "
              "needs 2.7: tinylm.device.COMPILE_TORCH; Muon 2.9; the tests 2.9)"),
    "lightning": ("2.6", "2.5.x: FlopsSummary.summarize() missing 'total_flops'; <2.5.5: no _parse_ckpt_path"),
    "tokenizers": ("0.20", "0.19: byte-fallback tokens counted as 3 bytes each (val/bpb), decoder=None refused"),
    "tiktoken": ("0.6", "runtime only; the tests need 0.12 (dev extra)"),
    "datasets": ("2.18", ""),
    "wandb": ("0.17.4", "0.16-0.17.0: np.float_ (numpy 2); 0.17.4: the smoke run (its W&B tests not all passed)"),
    "torchmetrics": ("1.6.2", "SumMetric(nan_strategy='disable')"),
    "jsonargparse": ("4.48", "<4.39: Lightning 2.6's instantiator; <4.48: no nearest-option hint"),
    "numpy": ("2.0", "pyarrow 26: 'pyarrow requires NumPy 2.0 or newer'"),
    "pyyaml": ("6.0", ""),
    "regex": ("2023.0", ""),
    "tqdm": ("4.62.1", "datasets 2.18 requires it"),
}


def _bounds() -> dict[str, str]:
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    # "name[extra]>=X" or "name>=X,<Y": the lower bound X
    return {m[1].lower(): m[2] for m in re.finditer(r'"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([^",;]+)[^"]*"', deps)}


def test_every_dependency_has_a_measured_bound():
    assert set(_bounds()) == set(OLDEST)


def test_no_bound_is_below_the_oldest_release_seen_to_work():
    for name, bound in _bounds().items():
        oldest, why = OLDEST[name]
        assert Version(bound) >= Version(oldest), f"{name}>={bound} admits releases that break tinylm: {why}"
        assert Version(bound) == Version(oldest), f"{name}>={bound}: record why in OLDEST (measured: {oldest})"
