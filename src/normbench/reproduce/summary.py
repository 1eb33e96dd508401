"""The claim's report: the report package's tables and figures for its runs, opening with the verdict."""

from __future__ import annotations

import html
from pathlib import Path

from normbench.report import build_report


def fmt(x, spec: str = ".4g") -> str:
    return "—" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def verdict_line(result: dict) -> str:
    ci = result.get("ci") or [None, None]
    metric = result["metric"] + (" (log ratio)" if result.get("transform") == "log" else "")
    line = (f"{result['claim']}: {result['verdict']} at scale={result['scale']} — {metric}: effect "
            f"{fmt(result['effect'])}, 95% CI [{fmt(ci[0])}, {fmt(ci[1])}], threshold {fmt(result['threshold'])}, "
            f"{result['n_seeds']} seeds")  # fmt: skip
    return line + (f" ({result['reason']})" if result.get("reason") else "")


def test_lines(result: dict) -> list[str]:
    out = []
    for t in result["tests"]:
        ci = t.get("ci") or [None, None]
        groups = "; ".join(f"{g}: mean {fmt(v['mean'])} over {len(v['values'])} values, outcomes "
                           f"{', '.join(f'{n} {k}' for k, n in sorted(v['outcomes'].items()))}"
                           for g, v in t["groups"].items())  # fmt: skip
        metric = t["metric"] + (f" (log ratio; ratio {fmt(t['ratio'])})" if t.get("transform") == "log" else "")
        note = " (reported, not judged)" if t.get("informative") else ""
        if tu := t.get("tuned"):  # each side at its own best value: say which, and what every value gave
            tried = "; ".join(f"{g} at {tu['key']}={tu['chosen'][g]} (tried: " + ", ".join(
                f"{v}: {', '.join(f'{n} {k}' for k, n in sorted(c.items()))}" for v, c in sorted(tu["tried"][g].items())
            ) + ")" for g in tu["chosen"])  # fmt: skip
            groups = f"{groups}. Each side at its own best {tu['key']}: {tried}"
        out.append(f"{t['name']}{note} ({t['kind']}, {metric}, {t.get('direction') or 'on par'}): **{t['verdict']}**, "
                   f"effect {fmt(t['effect'])}, 95% CI [{fmt(ci[0])}, {fmt(ci[1])}], threshold {fmt(t['threshold'])}"
                   + (f", reason: {t['reason']}" if t.get("reason") else "") + f". {groups}")  # fmt: skip
    return out


def write_report(result: dict, runs_dir: Path, claim_dir: Path) -> Path:
    """report.md/.html in ``claim_dir``: verdict line, each test, the claim figure, then the runs' report."""
    md, page, _, _ = build_report([runs_dir], out=claim_dir)
    head = [f"**Verdict — {verdict_line(result)}**", "",
            f"Claim: {result['statement']} ({result['paper']}).", "", "![claim](claim.png)", ""]  # fmt: skip
    head += [f"- {line}" for line in test_lines(result)] + ["", f"Runs: `{runs_dir}`; commit {result.get('commit')}; "
             f"runs' wall-clock total {result.get('run_time_s')} s.", ""]  # fmt: skip
    md.write_text("\n".join(head) + "\n" + md.read_text(encoding="utf-8"), encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    top = f"<p><b>Verdict — {html.escape(verdict_line(result))}</b></p>\n" + "".join(
        f"<p>{html.escape(line)}</p>\n" for line in test_lines(result)
    )
    page.write_text(text.replace("<body>\n", "<body>\n" + top, 1), encoding="utf-8")
    return md
