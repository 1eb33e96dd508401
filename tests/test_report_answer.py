"""The report's top (verdict and setup boxes), its rounding, its figure options and its page in a real browser,
on small made-up run directories (docs/contract.md §7)."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import subprocess

import pytest
import yaml

from normbench import report
from normbench.analysis import numbers
from normbench.report.verdicts import verdict_lines

ARCH_BASE = {"pre_ln": 2.0, "post_ln": 2.2, "peri_ln": 2.21}
SEED_NOISE = [0.0, 0.05, -0.03]  # shared by every group at a seed: what pairing removes
# layernorm minus rmsnorm at (arch, seed): small, both signs
NORM_DELTA = {
    ("pre_ln", 0): 0.01,
    ("pre_ln", 1): -0.012,
    ("pre_ln", 2): 0.004,
    ("post_ln", 0): -0.006,
    ("post_ln", 1): 0.009,
    ("post_ln", 2): -0.002,
    ("peri_ln", 0): 0.003,
    ("peri_ln", 1): -0.004,
    ("peri_ln", 2): 0.001,
}
ARCH_JITTER = {"pre_ln": [0.0] * 3, "post_ln": [0.004, -0.003, 0.002], "peri_ln": [-0.02, 0.02, 0.0]}


def best_loss(arch: str, norm: str, seed: int) -> float:
    jitter = ARCH_JITTER[arch][seed]  # so no difference is the same at every seed
    return ARCH_BASE[arch] + SEED_NOISE[seed] + jitter + (NORM_DELTA[(arch, seed)] if norm == "layernorm" else 0.0)


def make_run(
    path,
    arch: str,
    norm: str,
    seed: int,
    n_params: int = 1000,
    eval_every: int = 50,
    slope: float = 3.0,
    best: float | None = None,
    outcome: str = "learned",
) -> None:
    """A completed run: .hydra/ config and overrides, metrics with evaluations every ``eval_every``
    steps falling by ``slope`` nats over the run to ``best`` (default :func:`best_loss`), and the summary
    the trainer writes."""
    best = best_loss(arch, norm, seed) if best is None else best
    (path / ".hydra").mkdir(parents=True)
    cfg = {
        "seed": seed,
        "precision": "fp32",
        "model": {
            "name": "tiny",
            "n_layer": 2,
            "d_model": 64,
            "n_head": 4,
            "seq_len": 64,
            "init_std": "auto",
            "tie_embeddings": True,
            "vocab_size": None,
            "pad_vocab_to": 64,
        },
        "arch": {"name": arch, "scaled_init": True},
        "norm": {"name": norm},
        "optim": {
            "name": "adamw",
            "lr": 0.002,
            "weight_decay": 0.1,
            "betas": [0.9, 0.95],
            "eps": 1e-8,
            "decay_norm_in": False,
            "decay_norm_out": False,
            "decay_bias": False,
            "decay_embed": False,
            "decay_scalars": False,
        },
        "sched": {"name": "cosine", "warmup_steps": None, "min_lr_ratio": 0.1},
        "data": {"name": "kjv", "tokenizer": "byte", "vocab_size": None, "val_fraction": 0.05},
        "trainer": {"max_steps": 150, "batch_size": 16, "eval_every": eval_every, "grad_clip": 1.0, "eval_batches": 8},
    }
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"arch={arch}", f"norm={norm}", f"seed={seed}"]))
    records = []
    for step in range(0, 151, 10):
        rec = {
            "step": step,
            "tokens": step * 1024,
            "loss": best + 2.0 / (1 + step / 10),
            "lr": 2e-3,
            "time_s": step * 0.02,
        }
        if step % eval_every == 0:
            rec["val_loss"] = best + slope * (150 - step) / 150
        records.append(rec)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        "status": "completed",
        "reason": None,
        "step": 150,
        "tokens": 153_600,
        "final_val_loss": best,
        "best_val_loss": best,
        "tokens_per_s": 50_000.0,
        "n_params": n_params,
        "init_std": 0.06928,
        "tokens_per_param": 2.5,
        "max_steps": 150,
        "arch": arch,
        "norm": norm,
        "optim": "adamw",
        "seed": seed,
        "device": "cpu",
        "precision": "fp32",
        "spikes": 0,
        "baseline_loss": 3.0,
        "outcome": outcome,
        "compiled": False,
    }
    (path / "summary.json").write_text(json.dumps(summary))


def make_sweep(
    root,
    archs=("pre_ln", "post_ln", "peri_ln"),
    seeds=(0, 1, 2),
    skip=(),
    eval_every: int = 50,
    slope: float = 3.0,
    losses: dict | None = None,
    outcome: str = "learned",
):
    """``losses``: (arch, norm, seed) -> best val loss, instead of :func:`best_loss`."""
    i = 0
    for arch in archs:
        for norm in ("layernorm", "rmsnorm"):
            for seed in seeds:
                if (arch, norm, seed) not in skip:
                    make_run(
                        root / f"{i}_arch={arch},norm={norm},seed={seed}",
                        arch,
                        norm,
                        seed,
                        n_params=1000 + (64 if norm == "layernorm" else 0),
                        eval_every=eval_every,
                        slope=slope,
                        best=(losses or {}).get((arch, norm, seed)),
                        outcome=outcome,
                    )
                i += 1
    return root


def box_table(md: str, first_header: str) -> list[list[str]]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def paired_interval(diffs: list[float]) -> tuple[float, float, float]:
    """By hand: the one-sample t-interval of per-seed differences (mean, low, high)."""
    from scipy.stats import t

    m, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    half = t.ppf(0.975, len(diffs) - 1) * se
    return m, m - half, m + half


def test_numbers_are_rounded_to_the_spread():
    assert numbers.pm(7.6, 0.00644) == "7.600 ± 0.006"  # one figure for a spread starting 3-9
    assert numbers.pm(2.0428, 0.0156) == "2.043 ± 0.016"  # two figures for one starting 1 or 2
    assert numbers.pm(2.0417, 0.0013) == "2.0417 ± 0.0013"
    assert numbers.pm(85_900.4, 2_320) == "85,900 ± 2,300"  # thousands separators, never 8.59e+04
    assert numbers.pm(139.2, 3.1) == "139 ± 3" and numbers.pm(120.3, 26.1) == "120 ± 26"
    assert numbers.pm(0.5, 0.96) == "0.5 ± 1.0"  # rounds up into a leading 1: two figures
    assert numbers.pm(5.0, None) == "5.0000" and numbers.pm(5.0, 0.0) == "5.0000"  # no spread: the single format
    assert numbers.interval(0.149, 0.115, 0.184) == "+0.15 [+0.12, +0.18]"  # half-width 0.035
    assert numbers.interval(-0.003, -0.014, 0.008) == "-0.003 [-0.014, +0.008]"  # half-width 0.011
    with pytest.raises(ValueError):
        numbers.spread_decimals(0.0)


def holm_by_hand(ps: list[float]) -> list[float]:
    """Holm 1979: the k-th smallest of m p-values times (m - k + 1), never below the one before, at most 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


def test_holm_adjustment_by_hand():
    from normbench.analysis.contrasts import holm

    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept at 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    from normbench.analysis.contrasts import Contrast
    from normbench.report.verdicts import Effect

    # clear of 0 at 95% but not after the adjustment: not called (the sweep had peri_ln at p 0.013 -> 0.051)
    clear = Contrast(0.15, 0.11, 0.18, 0.013)
    assert Effect("arch", "peri_ln", "pre_ln", clear, p_holm=0.051).word == (
        "not detectable after Holm's adjustment (p 0.013 → 0.051)"
    )
    assert Effect("arch", "peri_ln", "pre_ln", clear, p_holm=0.03).word == "peri_ln worse (higher)"


def test_verdict_box_pools_with_the_seed_as_the_unit(tmp_path):
    root = make_sweep(tmp_path / "sweep")
    md = report.make_report(root, figures_too=False).read_text()
    # the answer comes first: the verdict box, then the setup box, then the tables
    assert md.index("## Verdict") < md.index("## Setup") < md.index("## Groups and outcomes")
    rows = {(r[0], r[1]): r for r in box_table(md, "factor")}
    assert set(rows) == {
        ("arch", "post_ln − pre_ln"),
        ("arch", "peri_ln − pre_ln"),
        ("norm", "layernorm − rmsnorm"),
        ("arch", "post_ln − peri_ln (for the ranking)"),
    }  # every comparison of the Holm family
    # norm: the config default (rmsnorm) is the baseline; per seed, the difference averaged over the 3 archs,
    # then the interval over the 3 seeds (2 degrees of freedom), not over 9 (arch, seed) pairs
    per_seed = [statistics.fmean(NORM_DELTA[(a, s)] for a in ("pre_ln", "post_ln", "peri_ln")) for s in (0, 1, 2)]
    m, lo, hi = paired_interval(per_seed)
    assert lo < 0 < hi
    norm = rows[("norm", "layernorm − rmsnorm")]
    assert norm[2] == numbers.interval(m, lo, hi) and norm[5].startswith("paired, 3 seeds x 3 settings; p ")
    assert norm[3] == "no detectable difference"
    # the norm effect at each arch: that arch's three per-seed differences
    at_pre = paired_interval([NORM_DELTA[("pre_ln", s)] for s in (0, 1, 2)])
    assert norm[4].startswith(f"arch=pre_ln: {numbers.interval(*at_pre)}; arch=post_ln: ")
    # arch: post_ln - pre_ln per seed: 0.2 + jitter, plus half the norm deltas' part (the layernorm setting)
    norm_part = {s: NORM_DELTA[("post_ln", s)] - NORM_DELTA[("pre_ln", s)] for s in (0, 1, 2)}
    post = [0.2 + ARCH_JITTER["post_ln"][s] + norm_part[s] / 2 for s in (0, 1, 2)]
    m, lo, hi = paired_interval(post)
    assert 0 < lo and rows[("arch", "post_ln − pre_ln")][2] == numbers.interval(m, lo, hi)
    # four comparisons (post-pre, peri-pre, post-peri, layernorm-rmsnorm), Holm-adjusted together
    from scipy.stats import ttest_1samp

    peri = [
        0.21 + ARCH_JITTER["peri_ln"][s] + (NORM_DELTA[("peri_ln", s)] - NORM_DELTA[("pre_ln", s)]) / 2
        for s in (0, 1, 2)
    ]
    ps = [ttest_1samp(d, 0).pvalue for d in (post, peri, [a - b for a, b in zip(post, peri)], per_seed)]
    adjusted = holm_by_hand(ps)
    assert "The box makes **4 comparisons**" in md
    shown = f"paired, 3 seeds x 2 settings; p {ps[0]:.2g} (Holm {adjusted[0]:.2g})"
    assert rows[("arch", "post_ln − pre_ln")][5] == shown
    assert adjusted[0] < 0.05 and rows[("arch", "post_ln − pre_ln")][3] == "post_ln worse (higher)"
    # peri_ln is 0.01 above post_ln on average, but its seeds scatter by 0.02: the two do not separate
    assert adjusted[2] > 0.05
    ranked = rows[("arch", "post_ln − peri_ln (for the ranking)")]
    assert ranked[5].endswith(f"p {ps[2]:.2g} (Holm {adjusted[2]:.2g})") and ranked[3] == "no detectable difference"
    assert "`arch`, lower best val loss first: pre_ln < post_ln ≈ peri_ln" in md


# the case: 3 archs x 2 norms x 2 seeds, the seed-to-seed shift shared by both norms
TWO_SEEDS = {
    ("pre_ln", "layernorm", 0): 2.000,
    ("pre_ln", "layernorm", 1): 1.980,
    ("pre_ln", "rmsnorm", 0): 2.004,
    ("pre_ln", "rmsnorm", 1): 1.983,
    ("post_ln", "layernorm", 0): 2.170,
    ("post_ln", "layernorm", 1): 2.190,  # +0.170, +0.210
    ("post_ln", "rmsnorm", 0): 2.194,
    ("post_ln", "rmsnorm", 1): 2.213,  # +0.190, +0.230
    ("peri_ln", "layernorm", 0): 2.100,
    ("peri_ln", "layernorm", 1): 2.100,  # +0.100, +0.120
    ("peri_ln", "rmsnorm", 0): 2.114,
    ("peri_ln", "rmsnorm", 1): 2.123,
}  # +0.110, +0.140


def test_two_seeds_two_norms_give_an_interval_with_one_degree_of_freedom(tmp_path):
    root = make_sweep(tmp_path / "sweep", seeds=(0, 1), losses=TWO_SEEDS)
    md = report.make_report(root, figures_too=False).read_text()
    rows = {(r[0], r[1]): r for r in box_table(md, "factor")}
    post = rows[("arch", "post_ln − pre_ln")]
    # by hand: per seed, post_ln - pre_ln averaged over the norms: seed 0 (0.17 + 0.19) / 2 = 0.18, seed 1
    # 0.22; mean 0.20, se = |0.22 - 0.18| / 2 = 0.02, t(0.975, 1 dof) = 12.706: 0.20 ± 0.254
    assert post[2] == "+0.20 [-0.05, +0.45]" and post[5].startswith("paired, 2 seeds x 2 settings; p ")
    assert post[5].endswith("; 2 seeds: 1 degree of freedom (t = 12.7), so the interval is wide")
    assert post[3] == "no detectable difference"  # pooled as 4 pairs (3 dof) it was [+0.159, +0.241]
    # per norm: 0.17, 0.21 -> 0.19 ± 0.254; 0.19, 0.23 -> 0.21 ± 0.254
    assert post[4] == "norm=layernorm: +0.19 [-0.06, +0.44]; norm=rmsnorm: +0.21 [-0.04, +0.46]"
    # peri_ln - pre_ln: 0.105, 0.130 -> 0.1175 ± 12.706 x 0.0125
    assert rows[("arch", "peri_ln − pre_ln")][2] == numbers.interval(0.1175, 0.1175 - 0.158826, 0.1175 + 0.158826)
    assert "Ranking" not in md  # nothing separates: no order is printed
    assert "The box makes **4 comparisons**" in md
    groups = report.group_runs(report.load_runs([root]))
    lines = verdict_lines(groups)
    assert lines[0] == "4 comparisons, Holm-adjusted together; the seed is the unit"
    assert (
        "arch: post_ln − pre_ln: +0.20 [-0.05, +0.45] nats, no detectable difference (paired, 2 seeds x 2 settings)"
    ) in lines


def test_verdict_box_says_where_the_settings_disagree(tmp_path):
    # post_ln is 0.2 worse at layernorm and 0.2 better at rmsnorm: pooled, nothing; per norm, opposite effects
    shift = {0: 0.0, 1: 0.03, 2: -0.01}
    losses = {
        (a, n, s): 2.0 + shift[s] + (0.0 if a == "pre_ln" else (0.2 if n == "layernorm" else -0.2) + 0.01 * s)
        for a in ("pre_ln", "post_ln")
        for n in ("layernorm", "rmsnorm")
        for s in (0, 1, 2)
    }
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"), losses=losses)
    rows = {(r[0], r[1]): r for r in box_table(report.make_report(root, figures_too=False).read_text(), "factor")}
    post = rows[("arch", "post_ln − pre_ln")]
    assert post[3] == (
        "no detectable difference; depends on the setting: intervals do not overlap (norm=layernorm "
        "vs norm=rmsnorm); signs differ (norm=layernorm vs norm=rmsnorm)"
    )


def test_a_sweep_whose_runs_all_got_stuck_has_no_verdict(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"), outcome="stuck")
    md = report.make_report(root, figures_too=False).read_text()
    assert "**No verdict can be made: every run got stuck or diverged (12 stuck)" in md
    assert {r[3] for r in box_table(md, "factor")} == {"no verdict: every compared run got stuck or diverged"}
    assert "no detectable difference" not in md.split("## Setup")[0].split("| factor |")[1]
    lines = verdict_lines(report.group_runs(report.load_runs([root])))
    assert len(lines) == 1 and lines[0].startswith("No verdict can be made: every run got stuck or diverged")


def test_a_setting_whose_runs_all_got_stuck_is_marked_and_left_out_of_the_disagreement(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"))
    for run in root.glob("*arch=post_ln*"):  # Post-LN learned nothing: its norm effect compares stuck losses
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "outcome": "stuck"}))
    rows = {(r[0], r[1]): r for r in box_table(report.make_report(root, figures_too=False).read_text(), "factor")}
    norm = rows[("norm", "layernorm − rmsnorm")]
    assert "arch=pre_ln: " in norm[4] and "; arch=post_ln (all stuck or diverged): " in norm[4]
    assert rows[("arch", "post_ln − pre_ln")][3] == "post_ln worse (higher)"  # pre_ln learned: a real difference


def test_verdict_box_falls_back_to_welch_over_seeds_and_takes_the_baseline_asked_for(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"), skip={("post_ln", "rmsnorm", 2)})
    md = report.make_report(root, figures_too=False, baseline="norm=layernorm").read_text()
    rows = {(r[0], r[1]): r for r in box_table(md, "factor")}
    norm = rows[("norm", "rmsnorm − layernorm")]  # --baseline turns the comparison round
    # post_ln ran seeds 0, 1 with rmsnorm: the seeds differ, so Welch's interval between the per-seed means
    assert norm[5].startswith("Welch, 3 vs 3 seeds x 2 settings; p ")
    xs = [
        statistics.fmean(best_loss(a, "rmsnorm", s) for a in ("pre_ln", "post_ln") if (a, s) != ("post_ln", 2))
        for s in (0, 1, 2)
    ]  # seed 2: pre_ln's alone
    bs = [statistics.fmean(best_loss(a, "layernorm", s) for a in ("pre_ln", "post_ln")) for s in (0, 1, 2)]
    d = report.welch_interval(xs, bs)
    assert norm[2] == numbers.interval(d.diff, d.low, d.high) and norm[3] == "no detectable difference"
    assert "Ranking" not in md  # two values per factor: the rows say it all


def test_the_sweeps_closing_leaderboard_says_how_many_groups(tmp_path):
    from normbench.cli.progress import leaderboard_lines

    lines = leaderboard_lines(make_sweep(tmp_path / "sweep"))
    assert lines[0] == "best val loss, top 3 of 6 groups, best first (mean ± std over seeds):"
    assert lines[1].startswith("1. arch=pre_ln norm=") and lines[4].startswith("verdict (")


def test_setup_box_says_what_was_held_fixed(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"), seeds=(0, 1))
    md = report.make_report(root, figures_too=False).read_text()
    setup = dict(box_table(md, "held fixed"))
    assert setup["varied"] == "arch (pre_ln, post_ln); norm (layernorm, rmsnorm)"
    assert setup["runs"] == "8 in 4 groups" and setup["seeds"] == "0, 1"
    assert setup["model"] == "tiny (2 blocks, d_model 64, 4 heads, seq 64)"
    assert setup["tokens trained"] == "153,600 (1,024 per step)"
    # as summary.json records it (tokens over the weight matrices): 2.5 at every run, though n_params differs
    assert setup["tokens per parameter"] == "2.5"
    assert setup["parameters"] == "1,000 to 1,064 (differs between groups)"
    assert setup["steps"] == "150, batch 16, eval every 50"
    assert setup["optimizer"] == "adamw, lr 0.002, weight decay 0.1, betas (0.9, 0.95), eps 1e-08"
    assert setup["weight decay"] == (
        "hidden matrices and an untied head decayed; not decayed: input-norm gains, "
        "output-norm gains, biases, embeddings, scalars"
    )
    assert setup["grad clip"] == "global norm 1"
    assert setup["LR schedule"] == "cosine, warmup 15 steps (null: 10% of 150), min lr ratio 0.1"
    # auto at d_model 64: 0.02 x sqrt(768 / 64) = 0.06928
    assert setup["init"] == "std 0.06928 (model.init_std=auto: 0.02 x sqrt(768 / d_model), GPT-2's gain at this width)"
    assert setup["output projections' init"] == "std / sqrt(2 x n_layer)"
    assert setup["embeddings"] == "tied (the head is the embedding)" and setup["data"] == "kjv, tokenizer byte"
    assert setup["vocab"] == "256 (byte)"  # 256 is already a multiple of 64: no padding
    assert setup["validation"] == "last 5% of the corpus held out; 8 batches per evaluation"
    assert setup["precision"] == "fp32" and setup["device"] == "cpu" and setup["mode"] == "eager"
    assert setup["commit"] == "not recorded by these runs"


def test_setup_box_says_where_the_groups_differ_and_resolves_what_the_arch_forces(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"), seeds=(0, 1))
    make_run(root / "9_arch=ngpt", "ngpt", "rmsnorm", 0, best=2.1)  # nGPT's recipe: no warmup, no weight decay
    for i, run in enumerate(sorted(root.iterdir())):  # the recorded ratio differs: shown as recorded, a range
        summary = json.loads((run / "summary.json").read_text())
        summary["init_std"] = 64**-0.5 if "ngpt" in run.name else summary["init_std"]  # nGPT's own init
        (run / "summary.json").write_text(json.dumps({**summary, "tokens_per_param": 2.48 if i % 2 else 2.49}))
    setup = dict(box_table(report.make_report(root, figures_too=False).read_text(), "held fixed"))
    assert setup["tokens per parameter"] == "2.48 to 2.49 (differs between groups)"
    assert setup["LR schedule"].startswith("differs: cosine, warmup 15 steps (null: 10% of 150)")
    assert "cosine, warmup 0 steps (ngpt's recipe)" in setup["LR schedule"]
    assert "weight decay 0 (ngpt's recipe)" in setup["optimizer"]
    assert (
        "std 0.125 (model.init_std=auto: 0.02 x sqrt(768 / d_model), GPT-2's gain at this width; the arch's own "
        "rule replaced it)" in setup["init"]
    )


def test_time_to_target_states_its_spacing_and_warns_when_coarse(tmp_path):
    coarse = report.make_report(make_sweep(tmp_path / "a", archs=("pre_ln", "post_ln")), figures_too=False)
    text = coarse.read_text().split("## Time to target")[1]
    assert "Evaluations every 50 steps" in text and "**Coarse:**" in text
    # the seeds' losses differ by up to 0.08 nats; falling 0.3 nats over 150 steps, they reach the target
    # tens of steps apart: wider than evaluations every 10 steps, so no warning
    fine = make_sweep(tmp_path / "b", archs=("pre_ln", "post_ln"), eval_every=10, slope=0.3)
    spreads = [statistics.stdev(xs) for xs in steps_to_target(fine).values()]
    assert min(spreads) > 10
    text = report.make_report(fine, figures_too=False).read_text().split("## Time to target")[1]
    assert "Evaluations every 10 steps" in text and "Coarse" not in text


def steps_to_target(root) -> dict[str, list[float]]:
    runs = report.load_runs([root])
    target = next(iter(report.default_targets(runs).values()))
    out: dict[str, list[float]] = {}
    for g in report.group_runs(runs):
        out[g.label] = [report.time_to_target(r, target).steps for r in g.runs]
    return out


def test_figure_formats_and_dpi(tmp_path):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln", "post_ln"), seeds=(0, 1))
    out = tmp_path / "out"
    assert report.main([str(root), "--out", str(out), "--format", "pdf,svg", "--dpi", "60"]) == 0
    assert (out / "loss_curves.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (out / "loss_curves.svg").read_bytes()[:500]
    import matplotlib.image

    height, width = matplotlib.image.imread(out / "loss_curves.png").shape[:2]
    assert width == round(6.8 * 60)  # 6.8 in wide (a paper's double column, the default) at 60 dpi
    md = (out / "report.md").read_text()
    assert "### `loss_curves.png` (also `loss_curves.pdf`, `loss_curves.svg`)" in md
    assert "Every figure: 8 runs in 4 groups; model tiny (2 blocks, 64 wide); 150 steps" in md
    page = (out / "report.html").read_text()
    assert "**" not in page and "<strong>best val loss</strong>" in page  # Markdown rendered
    assert re.search(r'<td class="num">2\.\d+ ± 0\.\d+</td>', page)  # numbers right-aligned


def test_bad_report_options_are_one_line(tmp_path, capsys):
    root = make_sweep(tmp_path / "sweep", archs=("pre_ln",), seeds=(0,))
    assert report.main([str(root), "--format", "png,jpeg"]) == 2
    assert capsys.readouterr().err.strip() == (
        "normbench: error: --format png,jpeg: jpeg is not a figure format; choose from: png, pdf, svg"
    )
    assert report.main([str(root), "--metric", "best_val_los"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("normbench: error: --metric best_val_los is not a metric (did you mean best_val_loss?)")
    assert report.main([str(root), "--dpi", "5"]) == 2
    assert "--dpi 5: choose a whole number from 50 to 1200" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the page in a real browser

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHECK = """<script>
window.addEventListener("load", () => {
  const vw = document.documentElement.clientWidth, out = {vw, page: document.documentElement.scrollWidth};
  out.tables = [...document.querySelectorAll("table")].map(t => {
    const box = t.parentElement, r = box.getBoundingClientRect();
    return {left: r.left, right: r.right, wide: t.scrollWidth > box.clientWidth,
            scrolls: getComputedStyle(box).overflowX === "auto"};
  });
  out.images = [...document.querySelectorAll("img")].map(i => i.complete && i.naturalWidth > 0);
  out.text = [...document.querySelectorAll("p, h1, h2, h3, figcaption")].map(e => {
    const r = e.getBoundingClientRect(); return [r.left, r.right]; });
  const pre = document.createElement("pre"); pre.id = "nbcheck"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def render(html_path, width: int) -> dict:
    """What the page looks like in headless Chromium at ``width`` px: CHECK's measurements."""
    page = html_path.with_name(f"check-{width}.html")
    page.write_text(html_path.read_text().replace("</body>", CHECK + "</body>"))
    proc = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--window-size={width},900",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="nbcheck">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the page's check did not run: {proc.stderr[-500:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def problems(seen: dict, margin: float = 12) -> list[str]:
    """Everything a reader would see as broken: the page scrolls sideways, a table sticks out of the window
    or is wider than its box without scrolling, an image did not load, text touches the window's edge."""
    vw, out = seen["vw"], []
    if seen["page"] > vw:
        out.append(f"the page is {seen['page']} px wide in a {vw} px window")
    for i, t in enumerate(seen["tables"]):
        if t["left"] < 0 or t["right"] > vw or (t["wide"] and not t["scrolls"]):
            out.append(f"table {i} overflows: {t}")
    out += [f"image {i} did not load" for i, ok in enumerate(seen["images"]) if not ok]
    out += [f"text at {lr} touches the edge" for lr in seen["text"] if lr[0] < margin or lr[1] > vw - margin]
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if browser() is None:
        pytest.skip(
            f"no headless browser: none of {', '.join(BROWSERS)} is on PATH (Debian: apt-get install "
            "chromium; CI installs it in .ci/run)"
        )
    root = make_sweep(tmp_path_factory.mktemp("page") / "sweep_with_a_long_directory_name_" / ("x" * 60))
    return report.build_report(root, dpi=60, formats=("png",))[1]


@pytest.mark.parametrize("width", [1000, 1400])
def test_the_page_in_a_real_browser(page, width):
    seen = render(page, width)
    html = page.read_text()
    assert len(seen["images"]) == html.count("<img") > 0 and len(seen["tables"]) == html.count("<table>") >= 5
    assert any(t["wide"] for t in seen["tables"]), "the all-runs table should be wider than the window here"
    assert problems(seen) == []


def test_the_browser_check_can_fail(page):
    """The same check on a page without the scroll boxes and margins: the all-runs table sticks out."""
    broken = page.with_name("broken.html")
    text = page.read_text().replace('<div class="scroll">', "<div>").replace("padding:0 clamp(1rem,3vw,2.5rem)", "")
    broken.write_text(text.replace('src="data:image/png;base64,', 'src="data:image/png;base64,AAAA', 1))
    found = problems(render(broken, 1000))
    assert any("overflows" in p for p in found) and any("did not load" in p for p in found)
    assert any("touches the edge" in p for p in found)
