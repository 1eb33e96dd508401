"""Markdown rows for docs/claims.md from the files ``reproduce`` writes.

    python scripts/claims_table.py verdict outputs/reproduce/peri_variance/verdict.json [...]
    python scripts/claims_table.py duration outputs/reproduce/peri_variance/duration.json
    python scripts/claims_table.py compare A/verdict.json B/verdict.json   # two measurements of one claim
    python scripts/claims_table.py ladder outputs/reproduce/dyt_parity/ladder.json   # a width ladder
    python scripts/claims_table.py lr outputs/reproduce/peri_variance/lr_ladder.json   # an LR ladder
    python scripts/claims_table.py record outputs/reproduce/peri_variance/verdict.json --into docs/verdicts \\
        --ran-on "a worktree at 8ffd7ce, AMD EPYC Zen 4, bf16 mode"
    python scripts/claims_table.py answer docs/verdicts --write docs/claims.md   # the one-table answer

``verdict``: one row per claim (each test's verdict, effect, interval and kind; each group's mean and
outcomes; the CPU seconds of its runs). ``duration``: one row per rung. ``compare``: per test, the two
effects and intervals side by side and the per-seed differences of each group's values (e.g. a branched
duration rung against a standalone run of the same length and seeds). ``ladder``: one row per test, one
column per width rung (effect, interval, verdict), then each group's mean and outcomes per rung (read from
the rungs' verdict.json). ``lr``: one row per LR rung (``reproduce ID lr=ladder``).

``record``: a claim's verdict.json as its small committed record, ``docs/verdicts/<claim>.json`` (the verdict,
where it was measured, each test's effect and interval, the commit), because ``outputs/`` does not survive
between sessions and the page's tables were pasted by hand: a landed verdict is copied, not transcribed;
``--ran-on TEXT`` says in its source where the runs ran. ``--into DIR`` writes ``DIR/<claim>.json`` and keeps
the ``ladders`` of the record it replaces (they come from ladder runs, not from the verdict); without it the
record goes to stdout. ``answer``: one table from those records, a row per claim in conf/claims order (the
verdict at the papers' length and step size, the test(s) it rests on with their intervals, what the ladders
say), printed, or with ``--write PAGE`` put between the page's ``<!-- answer:start -->`` and
``<!-- answer:end -->``; tests/test_claims_answer.py keeps docs/claims.md's copy equal to the records.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from normbench.claims import verdict as V
from normbench.claims.registry import claim_ids
from normbench.claims.summary import deciding

# a record's keys (docs/verdicts/<claim>.json) and each of its tests'
REQUIRED = ("claim", "paper", "verdict", "where", "tests", "source")
TEST_KEYS = ("name", "verdict", "effect", "ci", "interval", "seeds", "steps", "commit")
VERDICTS = (V.HOLDS, V.FAILS, V.INCONCLUSIVE)
PENDING = "20 tokens per parameter at the recipe's LR"  # the papers' length and step size, where not there yet
LADDERS = {"lr": "LR ladder", "duration": "duration ladder", "width": "width ladder"}
START, END = "<!-- answer:start -->", "<!-- answer:end -->"


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
    rows = [
        f"| {r['tokens_per_param']:g} | {r['steps']} | **{r['verdict']}** | "
        + "<br>".join(_test_short(t) for t in r["tests"])
        + f" | {g(r['run_time_s'], '.0f')} |"
        for r in d["rungs"]
    ]
    head = ["| tokens per parameter | steps | verdict | each test | CPU s |", "|---:|---:|---|---|---:|"]
    return [f"#### {d['claim']} ({d['mode']}, {g(d['run_time_s'], '.0f')} s of runs)", "", *head, *rows]


def lr_rows(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    rows = [
        f"| {r['lr']:.4g} ({r['factor']:.3g}×) | {r['steps']} | **{r['verdict']}** | "
        + "<br>".join(_test_short(t) for t in r["tests"])
        + f" | {g(r['run_time_s'], '.0f')} |"
        for r in d["rungs"]
    ]
    head = ["| peak LR (× the claim's) | steps | verdict | each test | CPU s |", "|---:|---:|---|---|---:|"]
    runs = f"{g(d['run_time_s'], '.0f')} s of runs"
    title = f"#### {d['claim']} (LR ladder around {d['lr']:.4g}, {d['lr_source']}; {runs})"
    return [title, "", *head, *rows]


def _test_short(t: dict) -> str:
    ci = t.get("ci") or [None, None]
    return f"{t['name']}: {t['verdict']} {g(t['effect'])} [{g(ci[0])}, {g(ci[1])}]"


def compare_rows(a_path: Path, b_path: Path) -> list[str]:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    rows = [
        "| test | A: effect [95% CI], verdict | B: effect [95% CI], verdict | per seed, B − A, each group |",
        "|---|---|---|---|",
    ]
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
    verdicts = [
        json.loads(Path(r["verdict_json"]).read_text()) if Path(r["verdict_json"]).exists() else None for r in rungs
    ]
    cols = [
        f"d {r['d_model']}, {r['n_layer']} blocks ({max(t.get('n_seeds') or 0 for t in r['tests'])} seeds)"
        for r in rungs
    ]
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


def record(path: Path, ran_on: str | None = None) -> dict:
    """A verdict.json (what ``reproduce`` writes) as a record: where it was measured from its ``length``,
    settings and ``mode``; every test (the table picks the deciding ones, as :func:`.summary.deciding` does)
    with the verdict's seeds, steps and commit; pending where it is not at 20 tokens per parameter."""
    v = json.loads(Path(path).read_text())
    length = v.get("length") or {}
    rec = {"claim": v["claim"], "paper": v.get("paper"), "verdict": v["verdict"], "where": _where(v)}
    if length.get("tokens_per_param") != 20:
        rec["pending"] = PENDING
    rec["tests"] = [
        {
            "name": t["name"],
            "verdict": t["verdict"],
            "effect": t.get("effect"),
            **({"ratio": t["ratio"]} if t.get("ratio") is not None else {}),
            "ci": t.get("ci"),
            "interval": t.get("interval") or ("grid" if t.get("kind") == "largest_lr" else None),
            "seeds": t.get("n_seeds"),
            "steps": length.get("steps"),
            "commit": v.get("commit"),
            "informative": bool(t.get("informative")),
        }
        for t in v["tests"]
    ]
    rec["source"] = (
        f"copied from {path}{f' ({ran_on})' if ran_on else ''} by scripts/claims_table.py record "
        f"(commit {v.get('commit')}, "
        f"{v.get('n_runs')} runs, scale={v.get('scale')})"
    )
    return rec


def _where(v: dict) -> str:
    """``20 tokens per parameter, recipe's LR, claims' mode (bf16 with fp32 attention, compiled)``."""
    length = v.get("length") or {}
    tpp = length.get("tokens_per_param")
    size = f"{tpp:g} tokens per parameter" if tpp else f"{length.get('steps')} steps (scale={v.get('scale')})"
    lrs = [s.split("=", 1)[1] for s in v.get("settings") or [] if s.split("=", 1)[0].lstrip("+") == "optim.lr"]
    lr = "the claim's own LR or grid" if not lrs else "recipe's LR" if lrs[-1] == "auto" else f"lr {lrs[-1]}"
    parts = [size, lr]
    if mode := v.get("mode"):
        form = mode["precision"] + (
            " with fp32 attention" if mode.get("attn_fp32") and mode["precision"] != "fp32" else ""
        )
        form += {True: ", compiled", False: ", eager"}.get(mode.get("compile"), "")
        parts.append(f"claims' mode ({form})" if mode.get("cpu_mode") == mode["precision"] else form)
    return ", ".join(parts)


def dumps(rec: dict) -> str:
    """A record as JSON, two-space indented, an interval on one line."""
    text = json.dumps(rec, indent=2, ensure_ascii=False)
    number = r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
    return re.sub(rf"\[\s*({number}),\s*({number})\s*\]", r"[\1, \2]", text) + "\n"


def check_record(rec: dict) -> list[str]:
    """What a record lacks: a required key, a test's key, a verdict outside the rule's three."""
    cid = rec.get("claim", "?")
    problems = [f"{cid}: no {k!r}" for k in REQUIRED if k not in rec]
    problems += [f"{cid}: verdict {rec.get('verdict')!r}"] if rec.get("verdict") not in VERDICTS else []
    for t in rec.get("tests") or []:
        problems += [f"{cid}, {t.get('name')!r}: no {k!r}" for k in TEST_KEYS if k not in t]
        problems += (
            [f"{cid}, {t.get('name')!r}: verdict {t.get('verdict')!r}"] if t.get("verdict") not in VERDICTS else []
        )
    return problems + ([f"{cid}: no tests"] if not rec.get("tests") else [])


def load_records(directory: Path) -> dict[str, dict]:
    """``{claim: record}`` from ``directory/*.json``; a record that fails :func:`check_record` is refused."""
    records = {}
    for path in sorted(Path(directory).glob("*.json")):
        rec = json.loads(path.read_text())
        if problems := check_record(rec):
            raise ValueError(f"{path}: " + "; ".join(problems))
        records[rec["claim"]] = rec
    return records


def paper_short(paper: str | None) -> str:
    """``Kim et al. 2025, arXiv:2502.02732``: each paper's first name field and its arXiv id, no notes."""
    out = []
    for part in re.sub(r"\s*\([^)]*\)", "", paper or "").split(";"):
        fields = [f.strip() for f in part.split(",") if f.strip()]
        arxiv = next((f for f in fields if f.startswith("arXiv:")), None)
        out += [", ".join([fields[0], arxiv] if arxiv else fields[:1])] if fields else []
    return "; ".join(out) or "—"


def effect_cell(t: dict) -> str:
    """``name: effect (×ratio) [lo, hi]`` to 3 significant digits (as the page's pasted rows), the interval's
    kind where it is not paired over seeds."""
    if t.get("interval") == "grid":
        return f"{t['name']}: {t['effect']:+g} (LR grid steps; no interval)"
    ratio = f" (×{g(t['ratio'])})" if t.get("ratio") is not None else ""
    ci = t.get("ci") or [None, None]
    kind = f" ({t['interval']})" if t.get("interval") not in ("paired", None) else ""
    return f"{t['name']}: {g(t['effect'])}{ratio} [{g(ci[0])}, {g(ci[1])}]{kind}"


def answer_row(rec: dict) -> str:
    """One claim's row: claim, paper, verdict and where, the deciding test(s), what the ladders say."""
    where = f"**{rec['verdict']}**, {rec['where']}"
    if rec.get("pending"):
        cost = rec.get("cost") or {}
        seconds, note = cost.get("cpu_s_estimate"), cost.get("note")
        price = (
            f" (about {seconds:,} CPU s)"
            if seconds
            else f", at no cost of its own: {note}"
            if seconds == 0 and note
            else ""
        )
        where += f"; *pending*: {rec['pending']}{price}"
    effects = "<br>".join(effect_cell(t) for t in deciding(rec))
    ladders = "<br>".join(f"{LADDERS.get(k, k)}: {s}" for k, s in (rec.get("ladders") or {}).items()) or "no ladder run"
    return f"| `{rec['claim']}` | {paper_short(rec.get('paper'))} | {where} | {effects} | {ladders} |"


ANSWER_NOTE = (
    "Generated from `docs/verdicts/<claim>.json` (one record per claim, each naming the verdict.json or the section "
    "of this page it was copied or transcribed from) by `python scripts/claims_table.py answer docs/verdicts "
    "--write docs/claims.md`; `tests/test_claims_answer.py` fails when this table and the records differ. The "
    "effect is group − baseline (a log ratio where a ratio is shown) of the test(s) the verdict rests on (every "
    "judged test when it HOLDS, else those whose verdict is the claim's), with its 95% interval, paired over seeds "
    "unless marked: the seed is the unit of every interval (the benchmark's rounds for tokens/s). A pending claim "
    "gives its latest verdict and what measuring it there costs. tpp: tokens per parameter; each ladder's cell "
    "begins with the setting that ladder ran at."
)


def answer_lines(directory: Path, ids: list[str] | None = None) -> list[str]:
    """The table, a row per claim of ``ids`` (default: conf/claims, in its order), then any other record's."""
    records = load_records(directory)
    ids = claim_ids() if ids is None else list(ids)
    if missing := [cid for cid in ids if cid not in records]:
        raise ValueError(f"no record in {directory} for: {', '.join(missing)}")
    order = ids + sorted(set(records) - set(ids))
    head = [
        "| claim | paper | verdict, where measured | deciding test: effect [95% CI] | as the miniature grows |",
        "|---|---|---|---|---|",
    ]
    return [*head, *(answer_row(records[cid]) for cid in order), "", ANSWER_NOTE]


def write_answer(page: Path, lines: list[str]) -> None:
    """Put the table between the page's answer markers (placed once, by hand, under its heading)."""
    text = Path(page).read_text()
    if START not in text or END not in text:
        raise ValueError(f"{page} has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    Path(page).write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + rest.split(END, 1)[1])


def answer_text(page: Path) -> str:
    """What is between the page's answer markers now (the test compares it with :func:`answer_lines`)."""
    return Path(page).read_text().split(START, 1)[1].split(END, 1)[0].strip("\n")


def _record_main(args: argparse.Namespace) -> int:
    rec = record(args.verdict, ran_on=args.ran_on)
    if args.into is None:
        print(dumps(rec), end="")
        return 0
    target = args.into / f"{rec['claim']}.json"
    if target.exists() and (old := json.loads(target.read_text()).get("ladders")):
        rec["ladders"] = old
    target.write_text(dumps(rec))
    print(f"wrote {target}")
    return 0


def _answer_main(args: argparse.Namespace) -> int:
    lines = answer_lines(args.directory)
    if args.write is not None:
        write_answer(args.write, lines)
    else:
        print("\n".join(lines))
    return 0


ROWS = {"verdict": lambda p: [verdict_row(p)], "duration": duration_rows, "ladder": ladder_rows, "lr": lr_rows}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/claims_table.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join([*ROWS, "compare", "record", "answer"]) + "}"
    )
    for name in ROWS:
        sub.add_parser(name).add_argument("paths", nargs="+", type=Path)
    compare = sub.add_parser("compare")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    rec = sub.add_parser("record")
    rec.add_argument("verdict", type=Path, help="a verdict.json that reproduce wrote")
    rec.add_argument("--into", type=Path, help="write DIR/<claim>.json (else print the record)")
    rec.add_argument("--ran-on", help="where the runs ran (worktree commit, CPU, mode), kept in the record's source")
    ans = sub.add_parser("answer")
    ans.add_argument("directory", type=Path, help="the records' folder (docs/verdicts)")
    ans.add_argument("--write", type=Path, help="put the table between PAGE's answer markers (else print it)")
    return parser


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # argparse's usage error (2) or --help (0), as a return code for the tests
        return int(stop.code or 0)
    if args.command == "record":
        return _record_main(args)
    if args.command == "answer":
        return _answer_main(args)
    lines = (
        compare_rows(args.a, args.b)
        if args.command == "compare"
        else [line for p in args.paths for line in ROWS[args.command](p)]
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
