"""The decoding options as each surface takes them, derived from their one declaration in SamplingConfig.

A surface (the library's `generate`, `tinylm generate`, `--samples.*` of fit, `tinylm sample-report`) lists the
options it takes as parameters whose default is `Option()`; `@sampling_options` gives each SamplingConfig's type,
default and docstring, so jsonargparse reads them in that surface's `--help` and `--print_config`::

    @sampling_options("--{}")
    def generate(ckpt_path: str, strategy=Option(), num_beams=Option(default=4), stop=Option("stop_strings")): ...

A surface changes a default (generate's beam width 4), or narrows a type where its meaning differs, and keeps its own
doc where it says more (the Args of its docstring win). `fn.options` (a `Surface`) turns the values back into a
SamplingConfig whose errors name the option as the user spelled it (``--top_p``, ``samples.top_p``).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from tinylm.generate.config import DEFAULTS, SamplingConfig, Spelling, check_options

_SAME: Any = object()  # an Option override left as SamplingConfig has it

# Options of the surfaces that load models (`tinylm generate`, `--samples.*`, `tinylm sample-report`) and are no
# SamplingConfig field (the library takes the model itself: `generate(..., draft=GPT)`): {name: (type, doc)}, each
# None by default. `Option()` fills them in like the fields; they are not passed to SamplingConfig.
CHECKPOINT_OPTIONS: dict[str, tuple[Any, str]] = {
    "draft_ckpt_path": (str | None, "Speculative decoding: a smaller model's .ckpt, trained with the same tokenizer, "
                        "that drafts num_draft_tokens tokens per step (greedy and sample; the text is the model's "
                        "own, only faster); null: no draft model."),
}


@dataclass(frozen=True)
class Option:
    """The default of a parameter that is a SamplingConfig field (``field``: its name there, when the parameter is
    called otherwise); ``default`` and ``annotation`` (its type) replace the field's for this surface. Immutable: a
    marker the decorator replaces, safe as a default (ruff: extend-immutable-calls)."""

    field: str | None = None
    default: Any = _SAME
    annotation: Any = _SAME


@functools.cache
def field_docs() -> dict[str, str]:
    """SamplingConfig's attribute docstrings, one line each: {field: text}."""
    source = textwrap.dedent(inspect.getsource(SamplingConfig))
    body = ast.parse(source).body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


@dataclass(frozen=True)
class Surface:
    """The decoding options one function takes: ``fields`` maps its parameter names to SamplingConfig's, in its
    order; ``defaults`` are its defaults, by field; ``spell`` is how its user writes them."""

    fields: Mapping[str, str]
    defaults: Mapping[str, Any]
    spell: Spelling

    def values(self, scope: Mapping[str, Any]) -> dict[str, Any]:
        """{field: value} of this surface's options, read from ``scope`` (the function's ``locals()``)."""
        return {f: scope[p] for p, f in self.fields.items()}

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise ValueError naming the first bad value of ``values`` ({field: value}) as the user spelled it."""
        check_options(values, self.spell)

    def config(self, values: Mapping[str, Any]) -> SamplingConfig:
        """SamplingConfig(**values); a bad value is named as the user spelled it."""
        self.check(values)
        return SamplingConfig(**values)


def sampling_options(form: str = "{}") -> Callable[[Callable], Callable]:
    """Fill in the parameters of the decorated function whose default is `Option()` (or all of SamplingConfig's
    fields, keyword-only, in place of ``**options``) from SamplingConfig: type, default and the docstring line its
    Args section gets. ``form`` spells an option for the user ("{}", "--{}", "samples.{}", see `Spelling`)."""

    def decorate(fn: Callable) -> Callable:
        derived, names, defaults = _derive(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = derived.bind(*args, **kwargs)
            bound.apply_defaults()  # the Option() defaults of fn itself are never seen
            return fn(*bound.args, **bound.kwargs)

        wrapper.__signature__ = derived
        documented = {**names, **{p: p for p in derived.parameters if p in CHECKPOINT_OPTIONS}}
        wrapper.__doc__ = _with_args(fn.__doc__, list(derived.parameters), documented)
        wrapper.options = Surface(names, defaults, Spelling(form, {f: p for p, f in names.items() if p != f}))
        return wrapper

    return decorate


def _derive(fn: Callable) -> tuple[inspect.Signature, dict[str, str], dict[str, Any]]:
    """(fn's signature with its options filled in, {parameter: field}, {field: default}: SamplingConfig's fields
    only, not CHECKPOINT_OPTIONS); every annotation is evaluated, so jsonargparse reads types, not strings."""
    signature, hints = inspect.signature(fn), typing.get_type_hints(fn)
    types = typing.get_type_hints(SamplingConfig)
    params, names, defaults = [], {}, {}
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:  # **options: every field not taken above
            for f in (f.name for f in fields(SamplingConfig) if f.name not in names.values()):
                params.append(p.replace(name=f, kind=p.KEYWORD_ONLY, default=DEFAULTS[f], annotation=types[f]))
                names[f], defaults[f] = f, DEFAULTS[f]
        elif isinstance(p.default, Option) and (p.default.field or p.name) in CHECKPOINT_OPTIONS:
            params.append(p.replace(default=None, annotation=CHECKPOINT_OPTIONS[p.default.field or p.name][0]))
        elif isinstance(p.default, Option):
            opt, name = p.default, p.default.field or p.name
            default = DEFAULTS[name] if opt.default is _SAME else opt.default
            annotation = types[name] if opt.annotation is _SAME else opt.annotation
            params.append(p.replace(default=default, annotation=annotation))
            names[p.name], defaults[name] = name, default
        else:
            params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
    returns = hints.get("return", signature.return_annotation)
    return signature.replace(parameters=params, return_annotation=returns), names, defaults


_ARG = re.compile(r"^    (\*{0,2}\w+)( \([^)]*\))?:")  # "    name: text" or "    name (type): text" in Args


def _with_args(doc: str | None, order: list[str], options: Mapping[str, str]) -> str:
    """``doc`` with an Args section documenting every parameter of ``order``: the option parameters that ``doc``
    does not document get their SamplingConfig docstring, or CHECKPOINT_OPTIONS' (``options``: parameter -> field)."""
    doc = inspect.cleandoc(doc or "")
    head, sep, tail = doc.partition("\nArgs:\n") if "\nArgs:\n" in doc else (doc, "", "")
    lines = tail.split("\n")
    end = next((i for i, ln in enumerate(lines) if ln and not ln.startswith(" ")), len(lines))  # the next section
    entries: dict[str, list[str]] = {}
    for ln in lines[:end]:
        m = _ARG.match(ln)
        if m:
            entries[m.group(1).lstrip("*")] = [ln]
        elif entries and ln.strip():
            entries[list(entries)[-1]].append(ln)
    docs = {**field_docs(), **{k: doc for k, (_, doc) in CHECKPOINT_OPTIONS.items()}}
    for name in order:
        if name not in entries and name in options:
            entries[name] = textwrap.wrap(f"{name}: {docs[options[name]]}", 116, initial_indent="    ",
                                          subsequent_indent="        ")
    ordered = [e for name in order if name in entries for e in entries[name]]
    rest = [e for name, lines_ in entries.items() if name not in order for e in lines_]
    tail_out = "\n".join(ordered + rest + ([""] + lines[end:] if lines[end:] else []))
    head = head.rstrip("\n") or "Options; the decoding ones are SamplingConfig's."  # (a docstring needs a summary)
    return head + "\n\nArgs:\n" + tail_out
