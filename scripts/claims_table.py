"""Markdown rows for docs/claims.md from the files ``reproduce`` writes.

    python scripts/claims_table.py verdict outputs/reproduce/peri_variance/verdict.json [...]
    python scripts/claims_table.py duration outputs/reproduce/peri_variance/duration.json
    python scripts/claims_table.py compare A/verdict.json B/verdict.json   # two measurements of one claim
    python scripts/claims_table.py ladder outputs/reproduce/dyt_parity/ladder.json   # a width ladder
    python scripts/claims_table.py lr outputs/reproduce/peri_variance/lr_ladder.json   # an LR ladder

``verdict``: one row per claim (each test's verdict, effect, interval and kind; each group's mean and
outcomes; the CPU seconds of its runs). ``duration``: one row per rung. ``compare``: per test, the two
effects and intervals side by side and the per-seed differences of each group's values (e.g. a branched
duration rung against a standalone run of the same length and seeds). ``ladder``: one row per test, one
column per width rung (effect, interval, verdict), then each group's mean and outcomes per rung (read from
the rungs' verdict.json). ``lr``: one row per LR rung (``reproduce ID lr=ladder``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def g(x, spec=".3g") -> str:
    return "—" if x is None else format(x, spec)


def _test(t: dict) -> str:
    ci = t.get("ci") or [None, None]
    ratio = f" (×{g(t['ratio'])})" if t.get("ratio") is not None else ""
    groups = " vs ".join(
        f"{name} {g(v['mean'])} ({', '.join(f'{n} {k}' for k, n in sorted(v['outcomes'].items()))})"
        for name, v in t["groups"].items()
    )
    return (
        f"{t['name']}: **{t['verdict']}** {g(t['effect'])}{ratio} [{g(ci[0])}, {g(ci[1])}] ({t.get('interval')}); "
        f"{groups}"
    )


def verdict_row(path: Path) -> str:
    v = json.loads(path.read_text())
    tests = "<br>".join(_test(t) for t in v["tests"])
    length = v.get("length") or {}
    return (
        f"| `{v['claim']}` | **{v['verdict']}** | {tests} | {length.get('steps')} | {g(v.get('run_time_s'), '.0f')} |"
    )


def duration_rows(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    rows = [f"| {r['tokens_per_param']:g} | {r['steps']} | **{r['verdict']}** | "
            + "<br>".join(_test_short(t) for t in r["tests"]) + f" | {g(r['run_time_s'], '.0f')} |"
            for r in d["rungs"]]  # fmt: skip
    head = ["| tokens per parameter | steps | verdict | each test | CPU s |", "|---:|---:|---|---|---:|"]
    return [f"#### {d['claim']} ({d['mode']}, {g(d['run_time_s'], '.0f')} s of runs)", "", *head, *rows]


def lr_rows(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    rows = [f"| {r['lr']:.4g} ({r['factor']:.3g}×) | {r['steps']} | **{r['verdict']}** | "
            + "<br>".join(_test_short(t) for t in r["tests"]) + f" | {g(r['run_time_s'], '.0f')} |"
            for r in d["rungs"]]  # fmt: skip
    head = ["| peak LR (× the claim's) | steps | verdict | each test | CPU s |", "|---:|---:|---|---|---:|"]
    runs = f"{g(d['run_time_s'], '.0f')} s of runs"
    title = f"#### {d['claim']} (LR ladder around {d['lr']:.4g}, {d['lr_source']}; {runs})"
    return [title, "", *head, *rows]


def _test_short(t: dict) -> str:
    ci = t.get("ci") or [None, None]
    return f"{t['name']}: {t['verdict']} {g(t['effect'])} [{g(ci[0])}, {g(ci[1])}]"


def compare_rows(a_path: Path, b_path: Path) -> list[str]:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    rows = ["| test | A: effect [95% CI], verdict | B: effect [95% CI], verdict | per seed, B − A, each group |",
            "|---|---|---|---|"]  # fmt: skip
    for ta, tb in zip(a["tests"], b["tests"]):
        diffs = []
        for name, va in ta["groups"].items():
            vb = tb["groups"].get(name)
            if vb and len(va["values"]) == len(vb["values"]):
                d = [y - x for x, y in zip(va["values"], vb["values"])]
                diffs.append(f"{name}: " + ", ".join(g(x) for x in d) + f" (mean {g(statistics.fmean(d))})")
        rows.append(f"| {ta['name']} | {_effect(ta)} | {_effect(tb)} | {'; '.join(diffs)} |")
    return rows


def ladder_rows(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    rungs = d["rungs"]
    verdicts = [json.loads(Path(r["verdict_json"]).read_text()) if Path(r["verdict_json"]).exists() else None
                for r in rungs]  # fmt: skip
    cols = [f"d {r['d_model']}, {r['n_layer']} blocks ({max(t.get('n_seeds') or 0 for t in r['tests'])} seeds)"
            for r in rungs]  # fmt: skip
    rows = [f"| test ({d.get('param')}) | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for i, t in enumerate(rungs[0]["tests"]):
        cells = [_effect(r["tests"][i]) for r in rungs]
        rows.append(f"| {t['name']} | " + " | ".join(cells) + " |")
    rows += ["", "| test: group (mean, outcomes) | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for i, t in enumerate(rungs[0]["tests"]):
        names = dict.fromkeys(n for v in verdicts if v for n in v["tests"][i]["groups"])
        for name in names:
            cells = []
            for v in verdicts:
                grp = v["tests"][i]["groups"].get(name) if v else None
                outcomes = ", ".join(f"{n} {k}" for k, n in sorted(grp["outcomes"].items())) if grp else ""
                cells.append(f"{g(grp['mean'])} ({outcomes})" if grp else "—")
            rows.append(f"| {t['name']}: {name} | " + " | ".join(cells) + " |")
    rows.append(f"\n{g(d.get('run_time_s'), '.0f')} s of runs over the rungs")
    return rows


def _effect(t: dict) -> str:
    ci = t.get("ci") or [None, None]
    return f"{g(t['effect'])} [{g(ci[0])}, {g(ci[1])}], {t['verdict']}"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("verdict", "duration", "compare", "ladder", "lr"):
        print(__doc__)
        return 2
    paths = [Path(p) for p in argv[1:]]
    if argv[0] == "verdict":
        lines = [verdict_row(p) for p in paths]
    elif argv[0] == "duration":
        lines = [line for p in paths for line in duration_rows(p)]
    elif argv[0] == "ladder":
        lines = [line for p in paths for line in ladder_rows(p)]
    elif argv[0] == "lr":
        lines = [line for p in paths for line in lr_rows(p)]
    else:
        lines = compare_rows(*paths[:2])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
