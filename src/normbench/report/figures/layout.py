"""No figure taller than a page: the layout rule every multi-panel figure of the report goes through."""

from __future__ import annotations

MAX_HEIGHT = 9.0  # inches: a page's text height (A4, US letter) less room for the caption; no figure is taller
TIGHT_PANEL = 1.2  # inches: the narrowest panel a figure gets to stay under MAX_HEIGHT, before its rows shrink
TIGHT_COLS = 6  # the most columns a figure gets to stay under MAX_HEIGHT


def fit_page(n: int, width: float, rows: int, cols: int, row_h: float, extra) -> tuple[int, int, float]:
    """(rows, columns, row height) of a grid of ``n`` panels whose figure is at most :data:`MAX_HEIGHT` tall:
    a grid that fits is kept as it is; else more columns, each still :data:`TIGHT_PANEL` wide (a
    single-column figure with many panels would otherwise run off the page: 6 heatmaps at 3.3 in were 11.6
    in tall), then rows shortened to fit. ``extra(rows, cols)``: the inches the figure adds to its rows
    (a legend below them, a colour bar's label)."""
    tall = lambda r, c: r * row_h + extra(r, c) > MAX_HEIGHT
    while tall(rows, cols) and cols < min(n, TIGHT_COLS) and width / (cols + 1) >= TIGHT_PANEL:
        cols += 1
        rows = -(-n // cols)
    if tall(rows, cols):
        row_h = (MAX_HEIGHT - extra(rows, cols)) / rows
    return rows, cols, row_h
