"""``python -m normbench report DIR [DIR ...]``: the command line of :func:`.build.build_report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from normbench.errors import ConfigError, Parser, error
from normbench.report import figures, table_files, verdicts
from normbench.report.build import build_report


def _step_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected steps like 0,100,500, got {text!r}") from None


def _key_list(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise argparse.ArgumentTypeError(f"expected keys like arch,norm, got {text!r}")
    return keys


def parser() -> Parser:
    """The options of ``normbench report``, each with its default and what it changes."""
    parser = Parser(prog="normbench report", description="Tables and figures for runs and sweeps.")
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run or sweep directories (merged)")
    parser.add_argument(
        "--target",
        "--target-loss",
        dest="target",
        type=float,
        metavar="LOSS",
        help="val loss for the time-to-target columns (default: per corpus, the best loss every learned run reached)",
    )
    parser.add_argument(
        "--group-by",
        type=_key_list,
        metavar="KEY[,KEY]",
        help="keys to group by (default: the overrides that differ between runs); e.g. arch,norm or model.n_layer",
    )
    parser.add_argument(
        "--filter",
        action="append",
        metavar="KEY=VALUE[,VALUE]",
        dest="filters",
        help="keep only runs with this setting (repeatable; all must hold)",
    )
    parser.add_argument(
        "--baseline",
        metavar="KEY=VALUE",
        help="show every group's difference from the group "
        "with KEY=VALUE (and its other settings), with a 95%% interval over seeds",
    )
    _output_options(parser)
    return parser


def _output_options(parser: Parser) -> None:
    """What is drawn and written: figures, their steps, styles, formats and sizes, the verdict's metric."""
    parser.add_argument(
        "--steps", type=_step_list, help="steps for the depth plots, e.g. 0,100 (the end is always drawn)"
    )
    parser.add_argument("--color-by", metavar="KEY", help="factor drawn as colour (default: arch if grouped by it)")
    parser.add_argument("--style-by", metavar="KEY", help="factor drawn as line style (default: norm if grouped by it)")
    parser.add_argument("--out", type=Path, help="where to write (default: the first DIR)")
    parser.add_argument("--no-figures", action="store_true", help="tables only (fast)")
    parser.add_argument(
        "--metric",
        default="best_val_loss",
        help="the verdict box's metric (default %(default)s): "
        f"{', '.join(verdicts.METRIC_NAMES)} or TASK/METRIC (eval.json)",
    )
    parser.add_argument(
        "--format",
        default=",".join(figures.FORMATS),
        metavar="FMT[,FMT]",
        help=f"figure formats besides the PNG the report embeds: {', '.join(figures.ALL_FORMATS)} "
        f"(default: {','.join(figures.FORMATS)})",
    )
    parser.add_argument(
        "--dpi", type=int, default=figures.DPI, help=f"resolution of PNG figures (default {figures.DPI})"
    )
    parser.add_argument(
        "--width",
        type=float,
        default=figures.WIDTH,
        metavar="INCHES",
        help=f"the figures' printed width: {figures.SINGLE:g} (a paper's single column) or "
        f"{figures.DOUBLE:g} (double, the default); every text 7 pt or more at it",
    )
    parser.add_argument(
        "--x",
        default="step",
        metavar="AXIS",
        help="the x axis of the loss and LR/grad-norm "
        "curves: step, tokens or time (wall-clock seconds since the start; default: step)",
    )
    parser.add_argument(
        "--runs",
        action="store_true",
        help="in the loss and LR/grad-norm curves, each run's own "
        "line (thin, its group's colour) under its group's mean, instead of the band",
    )


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help: argparse has printed it
        return int(e.code or 0)
    except ConfigError as e:  # a usage error: one line, like any other bad input
        return error(str(e))
    try:
        metric = verdicts.metric_name(args.metric)
        formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
        md, page, plots, n = build_report(
            args.dirs,
            args.target,
            args.steps,
            args.out,
            args.group_by,
            args.filters,
            args.baseline,
            args.color_by,
            args.style_by,
            not args.no_figures,
            metric=metric,
            formats=formats,
            dpi=args.dpi,
            width=args.width,
            x=args.x,
            runs_too=args.runs,
        )
    except ConfigError as e:
        print(f"normbench: error: {e}", file=sys.stderr)
        return 2
    print(f"normbench: report on {n} runs: {md}")
    print(f"normbench: html (figures embedded): {page}")
    print(f"normbench: tables as data: {', '.join(str(md.parent / f) for f in table_files.FILES)}")
    for p in plots:
        print(f"normbench: figure: {p}")
    return 0
