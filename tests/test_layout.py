"""The package's shape, as docs/development.md's picture draws it: no import cycles between tinylm's modules, no
module that imports its own package's face, the model free of Lightning, and modules and functions of a size one
can read."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tinylm"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# functions over the limit today, each with its length: the list only shrinks (a new long function fails)
LONG_FUNCTIONS = {
    "tinylm/generate/report.py:sample_report": 68,
    "tinylm/tokenize/bpe.py:from_vocab_merges": 63,
    "tinylm/tokenize/bpe.py:_train_merges": 62,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        name = ".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = f
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the tinylm modules it imports, at the top or inside a function (a lazy import is still a
    dependency); ``from tinylm.x import y`` is a dependency on tinylm.x.y when that is a module."""
    graph = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    graph[m].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_and_no_module_imports_its_own_package():
    """Catches a cycle such as checkpoint.py <-> hf.py (through init_from's loader) or cli/fit.py <-> cli/__init__,
    and a module that imports its package's __init__ (which imports the module back)."""
    graph = _imports(_modules())
    assert _cycles(graph) == []
    upward = [(m, t) for m, deps in graph.items() for t in deps if m.startswith(t + ".") and t != "tinylm"]
    assert upward == []


def test_the_model_imports_no_training_code():
    """Catches tinylm.model importing Lightning or tinylm's training, data or CLI code: a GPT one can read alone."""
    mods = _modules()
    for name, f in mods.items():
        if not name.startswith("tinylm.model"):
            continue
        text = f.read_text(encoding="utf-8")
        assert "lightning" not in text.replace("Lightning", ""), name
        assert not {t for t in _imports(mods)[name] if not t.startswith("tinylm.model")} - {"tinylm.errors",
                                                                                             "tinylm.ranges"}, name


def test_modules_and_functions_stay_readable():
    """Catches a module over 600 lines or a function over 60 (docstring included) creeping back."""
    long_modules = {str(f.relative_to(PACKAGE.parent)): n for f in PACKAGE.rglob("*.py")
                    if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long_modules == {}
    found = {}
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found[f"{f.relative_to(PACKAGE.parent)}:{node.name}"] = n
    grown = {k: n for k, n in found.items() if n > LONG_FUNCTIONS.get(k, MAX_FUNCTION_LINES)}
    assert grown == {}, f"functions over {MAX_FUNCTION_LINES} lines (split them): {grown}"


@pytest.mark.parametrize("module", ["tinylm.cli.main", "tinylm.cli.errors", "tinylm.cli.ranks"])
def test_the_cli_reads_no_module_of_its_own_through_sys_modules(module):
    """Catches the CLI reaching into its own modules through sys.modules (it did seven times) instead of importing
    them."""
    f = _modules()[module]
    assert 'sys.modules.get("tinylm' not in f.read_text(encoding="utf-8")
    assert 'sys.modules["tinylm' not in f.read_text(encoding="utf-8")


def test_the_development_guide_names_every_module():
    """Catches a module added without a word in docs/development.md's map of the package (eight were missing: a
    newcomer looking for the stability guard or what `tinylm prepare` runs found no file named)."""
    text = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    missing = [str(f.relative_to(PACKAGE.parent)) for f in sorted(PACKAGE.rglob("*.py"))
               if f.name not in ("__init__.py", "__main__.py") and f.name not in text]
    assert not missing, f"docs/development.md's map does not name {missing}"


NOT_MODULE_PATHS = {"tinylm.exchange", "tinylm.replace", "tinylm.export.swap", "tinylm.clean.v1",
                    "tinylm.corpus.files.v1", "tinylm.corpus.mixture.v1"}  # audit events and format tags


def test_every_dotted_tinylm_name_in_the_package_exists():
    """Catches a docstring or comment pointing a reader at a module or function that moved (`tinylm.cli.error_line`
    for tinylm.cli.errors.error_line, `tinylm.data.resplit`): each ``tinylm.a.b`` written in the package imports."""
    import importlib
    import re

    def resolves(name: str) -> bool:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:k]))
            except ModuleNotFoundError:
                continue
            for part in parts[k:]:
                if not hasattr(obj, part):
                    return False
                obj = getattr(obj, part)
            return True
        return False

    names = {m.rstrip(".") for f in PACKAGE.rglob("*.py")
             for m in re.findall(r"\btinylm(?:\.[A-Za-z_]\w*)+", f.read_text(encoding="utf-8"))}
    assert not sorted(n for n in names - NOT_MODULE_PATHS if not resolves(n))
