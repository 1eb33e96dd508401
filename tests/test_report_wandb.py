"""What a W&B or TensorBoard user looks for in ``normbench report`` (issue 52): each run's own curves
(``--runs``), tokens or seconds on the x axis (``--x``), the learning rate and gradient norm over training
(``lr_grad_norm.png``), the tables as CSV and JSON beside report.md, and no figure taller than a page at a
single column (docs/contract.md §7). Fake runs with real files, as in test_report.py."""

from __future__ import annotations

import csv
import json
import re
import statistics
import struct

import pytest

from normbench import report
from normbench.analysis.numbers import pm
from normbench.report import figures, table_files
from normbench.report.figures import layout
from test_report import captured, check_png, config, fake_records, make_run, summary_for, table

SEED_SPEED = {0: 0.1, 1: 0.13}  # seconds per step: the seeds' wall clocks differ, their tokens do not


def records(base: float, seed: int, diag_every: int = 50) -> list[dict]:
    """test_report's records, with a warmup in ``lr``, a falling ``grad_norm`` and a clock per seed."""
    recs = fake_records(base + 0.05 * seed, diag_every=diag_every)
    for r in recs:
        r["lr"] = 1e-3 * min(1.0, (r["step"] + 1) / 20)
        r["grad_norm"] = 50.0 / (1 + r["step"]) * (1 + 0.1 * seed)
        r["time_s"] = r["step"] * SEED_SPEED[seed % 2]
    return recs


def sweep(root, archs=("pre_ln", "post_ln"), seeds=(0, 1), diverged=True, diag_every=50, clip=1.0):
    """One job per (arch, seed), completed, and a deepnorm run that diverged; returns {job name: summary}."""
    summaries = {}
    for job, (arch, seed) in enumerate((a, s) for a in archs for s in seeds):
        recs = records(1.0 + 0.5 * archs.index(arch), seed, diag_every)
        summaries[str(job)] = summary_for(recs, arch, seed, spikes=seed)
        cfg = {**config(arch, seed), "trainer": {"grad_clip": clip}}
        make_run(root / str(job), [f"arch={arch}", f"seed={seed}"], cfg, recs, summaries[str(job)])
    if diverged:
        div = records(2.0, 0)[:5]
        div[-1]["loss"] = float("nan")
        summaries["div"] = summary_for(div, "deepnorm", 0, "diverged", "loss is nan at step 40")
        make_run(root / "div", ["arch=deepnorm", "seed=0"], config("deepnorm"), div, summaries["div"])
    return summaries


# ------------------------------------------------------------------ the tables as CSV and JSON


def read_csv(path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_tables_as_csv_and_json_hold_the_runs_summaries_unrounded(tmp_path):
    summaries = sweep(tmp_path)
    md = report.make_report(tmp_path, target_loss=2.0, figures_too=False).read_text()
    assert sorted(p.name for p in tmp_path.glob("report_*")) == sorted(table_files.FILES)

    runs_json = json.loads((tmp_path / "report_runs.json").read_text())
    runs_csv = read_csv(tmp_path / "report_runs.csv")
    assert list(runs_csv[0]) == list(runs_json[0])  # the same columns, in the same order
    assert list(runs_json[0])[:4] == ["run", "group", "arch", "seed"]  # each grouping key a column of its own
    assert set(table_files.RUN_COLUMNS) <= set(runs_json[0])
    assert [r["run"] for r in runs_json] == list(table(md.split("## All runs", 1)[1], "run"))  # the table's order
    for row, line in zip(runs_json, runs_csv):
        s = summaries[row["run"]]
        assert (row["arch"], row["seed"], row["status"]) == (s["arch"], s["seed"], s["status"])
        assert row["tokens_per_s"] == s["tokens_per_s"] and row["spikes"] == s["spikes"]
        assert row["step"] == s["step"] and row["tokens"] == s["tokens"] and row["n_params"] == s["n_params"]
        for key in ("final_val_loss", "best_val_loss"):
            assert row[key] == s[key]  # unrounded: the very float summary.json holds
            assert float(line[key]) == s[key]  # the CSV too: repr round-trips
        assert line["seed"] == str(s["seed"]) and line["status"] == s["status"]
    div = next(r for r in runs_json if r["run"] == "div")
    assert div["outcome"] == "diverged" and div["steps_to_target"] is None and "loss is nan" in div["reason"]
    assert next(r for r in runs_csv if r["run"] == "div")["steps_to_target"] == ""  # no value: an empty cell

    groups_json = json.loads((tmp_path / "report_groups.json").read_text())
    groups_csv = read_csv(tmp_path / "report_groups.csv")
    assert list(groups_csv[0]) == list(groups_json[0]) and list(groups_json[0])[:2] == ["group", "arch"]
    main, target = table(md, "group"), table(md.split("## Time to target")[1], "group")
    assert [g["group"] for g in groups_json] == list(main)  # sorted as the report sorts them
    for row in groups_json:
        cells = main[row["group"]]
        assert row["outcomes"] == cells["outcomes"] and row["status"] == cells["status"]
        assert str(row["runs"]) == cells["runs"]
        done = [s for s in summaries.values() if s["arch"] == row["arch"] and s["status"] == "completed"]
        if not done:
            assert row["best_val_loss_mean"] is None and row["averaged"] == 0 and "loss is nan" in row["notes"]
            continue
        bests = [s["best_val_loss"] for s in done]
        assert row["best_val_loss_mean"] == statistics.fmean(bests)
        assert row["best_val_loss_std"] == statistics.stdev(bests)
        assert row["tokens_per_s_mean"] == statistics.fmean(s["tokens_per_s"] for s in done)
        assert row["spikes"] == sum(s["spikes"] for s in done) and row["partial"] is False
        # the Markdown shows the same numbers, rounded to their spread
        assert cells["best val loss (= final in every run)"] == pm(row["best_val_loss_mean"], row["best_val_loss_std"])
        line = next(g for g in groups_csv if g["group"] == row["group"])
        assert float(line["best_val_loss_mean"]) == row["best_val_loss_mean"] and line["partial"] == "false"
        reached = target[row["group"]]
        assert row["target"] == 2.0 and f"{row['reached']}/{row['runs']}" == reached["reached"]
        if row["reached"] > 1:  # post_ln's seeds stay above 2.0
            assert reached["steps"] == pm(row["steps_to_target_mean"], row["steps_to_target_std"], ".0f")
    assert "`report_runs.csv`" in md.split("## All runs", 1)[1]


# ------------------------------------------------------------------ --x and --runs


def lines_of(fig, title_start: str) -> tuple:
    """The panel whose title starts so, and its lines (not the markers: those have one point)."""
    ax = next(a for a in fig.axes if a.get_title(loc="left").startswith(title_start))
    return ax, [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]


@pytest.mark.parametrize("axis", ["tokens", "time"])
def test_x_puts_tokens_or_seconds_on_the_curves_axis(tmp_path, monkeypatch, axis):
    sweep(tmp_path, diverged=False)
    figs = captured(monkeypatch)
    assert report.main([str(tmp_path), "--x", axis, "--format", "png", "--dpi", "50"]) == 0
    label = figures.X_AXES[axis][1]
    for name, title in (("loss_curves", "a  train loss"), ("lr_grad_norm", "a  learning rate")):
        ax, lines = lines_of(figs[name], title)
        assert ax.get_xlabel() == label
        pre_ln = [ln for ln in lines if ln.get_color() == "tab:blue"]
        steps = list(range(0, 101, 10))
        if axis == "tokens":  # the same for both seeds: the records' tokens, not their steps
            want = [s * 512 for s in steps]
        else:  # a group's line at its seeds' mean clock
            want = [statistics.fmean(s * SEED_SPEED[seed] for seed in (0, 1)) for s in steps]
        assert list(pre_ln[0].get_xdata()) == pytest.approx(want)
    # the depth figures stay on their own axes; the caption says what the x axis is
    md = (tmp_path / "report.md").read_text()
    assert f"Loss against {label}" in md and f"Learning rate and gradient norm against {label}" in md


def test_default_x_is_the_step(tmp_path, monkeypatch):
    sweep(tmp_path, diverged=False)
    figs = captured(monkeypatch)
    md = report.make_report(tmp_path, formats=("png",), dpi=50).read_text()
    ax, lines = lines_of(figs["loss_curves"], "a  train loss")
    assert ax.get_xlabel() == "training step" and list(lines[0].get_xdata()) == list(range(0, 101, 10))
    assert not [ln for fig in figs.values() for a in fig.axes for ln in a.get_lines() if ln.get_gid()]
    assert "Loss against training step. (a)" in md and "Thin lines" not in md


def test_runs_draws_one_line_per_run(tmp_path, monkeypatch):
    summaries = sweep(tmp_path, seeds=(0, 1, 2))
    figs = captured(monkeypatch)
    assert report.main([str(tmp_path), "--runs", "--format", "png", "--dpi", "50"]) == 0
    healthy = sorted(name for name, s in summaries.items() if s["status"] == "completed")
    for name, title in (
        ("loss_curves", "a  train loss"),
        ("loss_curves", "b  val loss"),
        ("lr_grad_norm", "b  gradient norm"),
    ):
        ax, lines = lines_of(figs[name], title)
        own = [ln for ln in lines if (ln.get_gid() or "").startswith("run:")]
        assert sorted(ln.get_gid()[4:] for ln in own) == healthy, (name, title)
        for ln in own:  # thin, in its group's colour: the arch's
            arch = summaries[ln.get_gid()[4:]]["arch"]
            assert ln.get_color() == figures.ARCH_COLORS[arch] and ln.get_linewidth() < 1
        # the diverged run is drawn on its own as before, and no band: the runs are its edges
        assert not ax.collections
    legend = [t.get_text() for t in figs["loss_curves"].legends[0].get_texts()]
    assert "one run (thick: the mean)" in legend and "seeds: min–max" not in legend
    assert "Thin lines: each run on its own" in (tmp_path / "report.md").read_text()


# ------------------------------------------------------------------ the LR and gradient-norm figure


@pytest.mark.slow
def test_lr_and_grad_norm_figure_with_its_caption(tmp_path, monkeypatch):
    sweep(tmp_path)
    figs = captured(monkeypatch)
    md = report.make_report(tmp_path, formats=("png", "pdf"), dpi=60).read_text()
    check_png(tmp_path / "lr_grad_norm.png")
    assert (tmp_path / "lr_grad_norm.pdf").read_bytes().startswith(b"%PDF")
    section = md.split("### `lr_grad_norm.png` (also `lr_grad_norm.pdf`)")[1].split("###")[0]
    assert "(a) The learning rate" in section and "the clipping threshold (1) dotted" in section
    lr_ax, lr_lines = lines_of(figs["lr_grad_norm"], "a  learning rate")
    assert lr_ax.get_ylabel() == "learning rate" and lr_ax.get_ylim()[0] == 0
    assert max(lr_lines[0].get_ydata()) == pytest.approx(1e-3)  # the warmup's peak
    gn_ax, _ = lines_of(figs["lr_grad_norm"], "b  gradient norm")
    assert gn_ax.get_yscale() == "log"  # 50 down to 0.5: more than 30x
    assert any(ln.get_linestyle() == ":" and list(ln.get_ydata()) == [1.0, 1.0] for ln in gn_ax.get_lines())
    page = (tmp_path / "report.html").read_text()
    assert 'alt="learning rate and total gradient norm against training step' in page


def test_lr_and_grad_norm_figure_skipped_without_them(tmp_path):
    recs = [{k: v for k, v in r.items() if k not in ("lr", "grad_norm")} for r in fake_records(1.0)]
    make_run(tmp_path / "run", ["arch=pre_ln"], config(), recs, summary_for(recs, "pre_ln", 0))
    md = report.make_report(tmp_path, formats=("png",), dpi=50).read_text()
    assert "`lr_grad_norm.png` skipped: no run logged `lr`." in md
    assert not (tmp_path / "lr_grad_norm.png").exists()


# ------------------------------------------------------------------ bad values


@pytest.mark.parametrize(
    "args, line",
    [
        (["--x", "foo"], "normbench: error: --x=foo is not allowed; choose one of: step, tokens, time"),
        (["--x=steps"], "normbench: error: --x=steps is not allowed; choose one of: step, tokens, time"),
        (
            ["--runs=yes"],
            "normbench: error: report: argument --runs: ignored explicit argument 'yes' (see normbench report --help)",
        ),
    ],
)
def test_a_bad_value_is_one_line_and_writes_nothing(tmp_path, capsys, args, line):
    sweep(tmp_path, archs=("pre_ln",), seeds=(0,), diverged=False)
    assert report.main([str(tmp_path), *args]) == 2
    captured_io = capsys.readouterr()
    assert captured_io.err == line + "\n" and captured_io.out == ""
    assert not list(tmp_path.glob("report*"))


# ------------------------------------------------------------------ no figure taller than a page


def png_inches(path, dpi: int) -> tuple[float, float]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk: pixels
    return width / dpi, height / dpi


def pdf_inches(path) -> tuple[float, float]:
    box = re.search(rb"/MediaBox\s*\[\s*0 0 ([\d.]+) ([\d.]+)\s*\]", path.read_bytes())
    return float(box.group(1)) / 72, float(box.group(2)) / 72


@pytest.mark.slow
def test_no_figure_taller_than_a_page_at_a_single_column(tmp_path, monkeypatch):
    archs = ("pre_ln", "post_ln", "peri_ln", "mix_ln", "hybridnorm", "deepnorm", "ngpt", "sandwich")
    sweep(tmp_path / "runs", archs=archs, seeds=(0,), diverged=False, diag_every=10)
    # before: 8 heatmaps in one column of 1.85 in rows, 15 in tall; 11 depth panels in 6 rows of 1.6 in
    _, _, row = figures.grid(len(archs), 3.3 - 0.6, max_cols=3)
    assert len(archs) * 0.75 * row + 0.5 > layout.MAX_HEIGHT
    figs = captured(monkeypatch)
    steps = ",".join(str(s) for s in range(0, 100, 10))  # 10 steps and the end: 11 depth panels
    out = tmp_path / "out"
    args = [str(tmp_path / "runs"), "--out", str(out), "--width", "3.3", "--steps", steps, "--dpi", "50"]
    assert report.main([*args, "--format", "png,pdf"]) == 0
    pngs, pdfs = sorted(out.glob("*.png")), sorted(out.glob("*.pdf"))
    assert len(pngs) == len(pdfs) == 8  # loss, LR/grad norm, 3 depth, 2 heatmaps, layer statistics
    for path in pngs:
        width, height = png_inches(path, 50)
        assert width == pytest.approx(3.3, abs=0.03) and height <= layout.MAX_HEIGHT + 0.03, path.name
    for path in pdfs:
        width, height = pdf_inches(path)
        assert width == pytest.approx(3.3, abs=0.01) and height <= layout.MAX_HEIGHT + 0.01, path.name
    # each heatmap still legible: two columns of panels at least an inch wide and tall, one colour bar
    for name in ("grad_norm_layer_heatmap", "var_resid_heatmap"):
        fig = figs[name]
        panels = [a for a in fig.axes if a.get_title(loc="left")]
        assert len(panels) == len(archs) and fig.get_figheight() <= layout.MAX_HEIGHT
        assert panels[0].get_gridspec().ncols == 2
        for ax in panels:
            box = ax.get_position()
            assert box.width * fig.get_figwidth() >= 0.9 and box.height * fig.get_figheight() >= 1.0, name
    depth = [a for a in figs["var_resid_depth"].axes if a.get_title(loc="left")]
    assert len(depth) == 11 and depth[-1].get_title(loc="left").startswith("k  end")


def test_fit_page_keeps_a_grid_that_fits_and_caps_one_that_does_not():
    below = lambda rows, cols: 0.7
    assert layout.fit_page(3, 6.8, 1, 3, 2.0, below) == (1, 3, 2.0)  # today's figures: unchanged
    assert layout.fit_page(6, 2.7, 6, 1, 1.85, below) == (3, 2, 1.85)  # more columns first
    rows, cols, row_h = layout.fit_page(40, 2.7, 40, 1, 1.85, below)  # then shorter rows
    assert cols == 2 and rows * row_h + 0.7 == pytest.approx(layout.MAX_HEIGHT)
