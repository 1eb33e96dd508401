"""The report's blocks as Markdown (report.md) and as one self-contained HTML page (report.html).

A block is a tuple: ``("h", level, text)``, ``("p", text)``, ``("table", header, rows[, caption])``,
``("img", file, alt[, caption])`` or ``("boxes", [(title, blocks), ...])`` (boxes side
by side in HTML, the first one wider, wrapping onto two rows on a narrow window; one after another in
Markdown). Inline Markdown (``**bold**``, `` `code` ``) is
rendered by markdown-it-py (the CommonMark implementation rich already brings), so the HTML shows
no asterisks. The page keeps margins at any width, right-aligns numeric columns (their headers wrap, their
cells do not) and puts every table in a box that scrolls sideways instead of cutting the table off. Every
table has a caption (its own, shown, or its section's heading, for screen readers only) and column headers
with ``scope``.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

NUMERIC = re.compile(r"^[+-]?(\d[\d,]*(\.\d+)?|\.\d+)([eE][+-]?\d+)?%?(\s*(±|\[|\()|$)")
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;line-height:1.45;color:#222;
  max-width:78rem;margin:0 auto;padding:0 clamp(1rem,3vw,2.5rem) 3rem}
h1{margin-top:1.2rem;overflow-wrap:anywhere}h2{margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.scroll{overflow-x:auto;max-width:100%;margin:.6rem 0}
table{border-collapse:collapse;font-size:.92rem}
td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
th{background:#f4f4f4;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}td.num{white-space:nowrap}
td{min-width:3.5rem}
caption{caption-side:top;text-align:left;font-size:.9rem;color:#444;padding:.2rem 0}
.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);white-space:nowrap}
img{max-width:100%;height:auto}
figure{margin:1rem 0}figcaption{font-size:.9rem;color:#444;max-width:60rem}
code{background:#f2f2f2;padding:0 .2em;border-radius:3px;font-size:.92em}
.boxes{display:flex;flex-wrap:wrap;gap:1.2rem;align-items:flex-start}
.box{flex:1 1 24rem;min-width:0;border:1px solid #bbb;border-radius:6px;padding:.2rem 1rem .6rem;background:#fbfbfd}
.box.wide{flex:2 1 34rem}.box h2{margin-top:.6rem;border:0}
"""


def _inline(text: str) -> str:
    from markdown_it import MarkdownIt  # deferred (start-up time): markdown_it

    return MarkdownIt("commonmark").renderInline(str(text))


def is_numeric(cell: str) -> bool:
    return bool(NUMERIC.match(str(cell).strip()))


def _numeric_columns(header: list[str], rows: list[list[str]]) -> set[int]:
    """Columns whose filled cells (not a dash) are all numbers."""
    out = set()
    for i in range(len(header)):
        cells = [str(r[i]).strip() for r in rows if i < len(r) and str(r[i]).strip() not in ("", "—")]
        if cells and all(is_numeric(c) for c in cells):
            out.add(i)
    return out


def to_markdown(blocks: list[tuple]) -> str:
    out = []
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"{'#' * rest[0]} {rest[1]}")
        elif kind == "p":
            out.append(rest[0])
        elif kind == "table":
            header, rows, *caption = rest
            if caption and caption[0]:
                out += [f"*{caption[0]}*", ""]
            cell = lambda c: str(c).replace("|", "\\|")
            nums = _numeric_columns(header, rows)
            out += [
                "| " + " | ".join(map(cell, header)) + " |",
                "|" + "".join("---:|" if i in nums else "---|" for i in range(len(header))),
            ]
            out += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
        elif kind == "img":
            out.append(f"![{rest[1]}]({rest[0]})" + (f"\n\n{rest[2]}" if len(rest) > 2 else ""))
        elif kind == "boxes":
            for title, inner in rest[0]:
                out.append(to_markdown([("h", 2, title), *inner]))
        out.append("")
    return "\n".join(out)


def _table_html(header: list[str], rows: list[list[str]], caption: str | None = None, heading: str = "") -> str:
    """A table in its sideways-scrolling box: its own caption shown, else its section's heading for screen
    readers; ``scope="col"`` on each header cell."""
    nums = _numeric_columns(header, rows)
    cls = lambda i: ' class="num"' if i in nums else ""
    cap = f"<caption>{_inline(caption)}</caption>" if caption else f'<caption class="sr">{_inline(heading)}</caption>'
    head = "<tr>" + "".join(f'<th scope="col"{cls(i)}>{_inline(h)}</th>' for i, h in enumerate(header)) + "</tr>"
    body = ["<tr>" + "".join(f"<td{cls(i)}>{_inline(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows]
    return '<div class="scroll"><table>\n' + "\n".join([cap, head, *body]) + "\n</table></div>"


def _body(blocks: list[tuple], out_dir: Path, heading: str = "") -> list[str]:
    body = []
    for kind, *rest in blocks:
        if kind == "h":
            heading = rest[1]
            body.append(f"<h{rest[0]}>{_inline(rest[1])}</h{rest[0]}>")
        elif kind == "p":
            body.append(f"<p>{_inline(rest[0])}</p>")
        elif kind == "table":
            body.append(_table_html(*rest, heading=heading))
        elif kind == "img":
            data = base64.b64encode((out_dir / rest[0]).read_bytes()).decode("ascii")
            cap = f"<figcaption>{_inline(rest[2])}</figcaption>" if len(rest) > 2 else ""
            body.append(f'<figure><img alt="{html.escape(rest[1])}" src="data:image/png;base64,{data}">{cap}</figure>')
        elif kind == "boxes":
            inner = [
                f'<section class="box{" wide" if i == 0 else ""}"><h2>{_inline(t)}</h2>\n'
                + "\n".join(_body(b, out_dir, t))
                + "</section>"
                for i, (t, b) in enumerate(rest[0])
            ]
            body.append('<div class="boxes">\n' + "\n".join(inner) + "\n</div>")
    return body


def to_html(blocks: list[tuple], out_dir: Path, title: str = "normbench report") -> str:
    """The page, every figure embedded as a data URI (one file to send); ``title`` names it in the browser's
    tab and history (the sweep, or the claim)."""
    plain = re.sub(r"[*`]", "", title)  # a <title> shows no Markdown
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(plain)}</title><style>{STYLE}</style></head>\n<body>\n"
    )
    return head + "\n".join(_body(blocks, out_dir)) + "\n</body></html>\n"
