"""matplotlib, imported lazily (an optional extra): a figure and its PNG canvas, no pyplot global state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tinylm.errors import TinyLMError


def figure_canvas(**figure_kwargs: Any) -> tuple[Any, Any]:
    """(Figure, FigureCanvasAgg) at 120 dpi; a one-line error naming the extra when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise TinyLMError('matplotlib is not installed, and plots need it: pip install "tinylm[plots]"') from None
    fig = Figure(dpi=120, **figure_kwargs)
    return fig, FigureCanvasAgg(fig)


def save_png(canvas: Any, out: str | Path, option: str = "out", *, drawn_by: str | None = None) -> Path:
    """Write ``canvas`` (from `figure_canvas`) as the PNG ``out``, making its folder; a name that is not a .png is a
    ValueError (the bytes are PNG whatever the name says: x.jpg held a PNG). ``drawn_by``: the command, kept in the
    PNG's text (`drawn_by`) so that a later run of it knows its own picture from a user's."""
    path = Path(out)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{option} must name a .png file, got {str(out)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    from tinylm.paths import replace_file

    metadata = {DRAWN_BY: drawn_by} if drawn_by else None
    replace_file(path, lambda tmp: canvas.print_png(str(tmp), metadata=metadata))
    return path


DRAWN_BY = "tinylm"  # the PNG text key `save_png` writes the command under


def drawn_by(png: str | Path) -> str | None:
    """The command whose `save_png` wrote ``png`` (its PNG text ``tinylm``), or None: another file, or none."""
    from PIL import Image  # (matplotlib's own dependency)

    try:
        with Image.open(png) as image:
            return getattr(image, "text", {}).get(DRAWN_BY)
    except (OSError, ValueError):  # (PIL's UnidentifiedImageError is an OSError)
        return None


def check_png_path(out: str | Path, option: str = "--out") -> Path:
    """`out` as a Path a PNG can be written to, checked before any work: a .png name that is not a folder, in a
    place where files can be created (tinylm.paths), and matplotlib installed (one-line errors naming the fix)."""
    from tinylm.paths import check_output_path

    path = Path(out)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{option} must name a .png file, got {str(out)!r}")
    check_output_path(path, option)  # (a folder named x.png: "is a folder; pass a file path")
    figure_canvas()  # the one-line error naming the extra when matplotlib is missing
    return path
