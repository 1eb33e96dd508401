"""Numbers shown to the precision their spread supports.

A spread (a sample std or a 95% interval's half-width) is shown with one significant figure, or two
when its leading digit is 1 or 2 (where rounding to one figure would change it by up to 50%: the
convention of the Particle Data Group's Review, "Rounding", and of most measurement guides), and
the value beside it is rounded to the same decimal place. So ``7.6 ± 0.00644`` reads
``7.600 ± 0.006`` and ``2.0428 ± 0.0155`` reads ``2.043 ± 0.016``. Whole numbers of a thousand
and more get thousands separators (``85,900 ± 2,300``), never ``8.59e+04``.
"""

from __future__ import annotations

import math


def spread_decimals(spread: float) -> int:
    """Decimal places that show ``spread`` with 1 significant figure (2 when it starts with 1 or 2);
    negative for a spread of tens or more (round to tens, hundreds, ...)."""
    if not math.isfinite(spread) or spread <= 0:
        raise ValueError(f"a spread must be positive and finite, got {spread!r}")
    exp = math.floor(math.log10(spread))
    lead = int(spread / 10**exp + 1e-9)  # first significant digit
    if lead >= 10:  # 9.96 -> 10: the rounding carried into the next decade
        exp, lead = exp + 1, 1
    figures = 2 if lead in (1, 2) else 1
    return figures - 1 - exp  # 0.96 -> 1.0: the carried digit is a 1, and a 1 gets two figures


def at(x: float, decimals: int, sign: bool = False) -> str:
    """``x`` rounded to ``decimals`` places (negative: to tens, hundreds, ...), with thousands separators."""
    if decimals < 0:
        x = round(x, decimals)
        decimals = 0
    text = f"{x:+,.{decimals}f}" if sign else f"{x:,.{decimals}f}"
    if text.lstrip("+-").strip("0.,") == "":  # -0.00 -> 0.00: a rounded zero has no sign
        text = text.lstrip("+-")
    return text


def pm(mean: float, spread: float | None, single: str = ".4f") -> str:
    """``mean ± spread`` at the spread's precision; ``single`` formats a mean without a spread (one run)."""
    if spread is None or not math.isfinite(spread) or spread <= 0:
        return format(mean, single)
    d = spread_decimals(spread)
    return f"{at(mean, d)} ± {at(spread, d)}"


def interval(effect: float, low: float | None, high: float | None, single: str = ".4f") -> str:
    """``+0.15 [+0.12, +0.18]``: a signed effect and its interval, at the half-width's precision."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return format(effect, "+" + single)
    half = (high - low) / 2
    if half <= 0:
        return f"{format(effect, '+' + single)} [{format(low, '+' + single)}, {format(high, '+' + single)}]"
    d = spread_decimals(half)
    return f"{at(effect, d, True)} [{at(low, d, True)}, {at(high, d, True)}]"
