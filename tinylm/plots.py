"""matplotlib, imported lazily (an optional extra): a figure and its PNG canvas, no pyplot global state."""

from __future__ import annotations

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
