"""The report's sections as blocks of the page (:mod:`.page`): the answer (verdict and setup boxes), the
groups and their outcomes, time to target, per-layer statistics, the baseline, the LR sweep and Optuna;
each a function of the loaded groups, in the order the report shows them (:func:`.build.build_report`)."""

from __future__ import annotations

from pathlib import Path

from normbench.analysis.loading import load_yaml
from normbench.analysis.stats import eval_spacing
from normbench.diag.outcomes import MASSIVE_THRESHOLD, STUCK_MARGIN
from normbench.report import tables, verdicts
from normbench.report.setup import setup_rows

DASH = "—"


def _target_text(target, defaults) -> str:
    if target is not None:
        return f"{target:g} (given)"
    if not defaults:
        return f"{DASH} (no run learned; give --target)"
    per = ", ".join(f"{v:g} on {c}" if len(defaults) > 1 else f"{v:g}" for c, v in defaults.items())
    return f"{per} (the largest best val loss among the runs that learned, rounded up: every learned run reached it)"


def answer(groups, chosen, metric: str, target, defaults) -> tuple:
    """The verdict box (each varied factor against its baseline) beside the setup box (what was held fixed)."""
    if len(groups) < 2:
        verdict = [("p", "One group: nothing was varied to compare (group the runs with `--group-by`).")]
    else:
        box = verdicts.verdict_box(groups, chosen, metric, target, defaults)
        bases = ", ".join(f"`{k}={v}`" for k, v in verdicts.baselines(groups, chosen).items())
        verdict = [("p", f"**{box.no_verdict}**")] if box.no_verdict else []
        verdict += [
            (
                "p",
                f"Effect on the **{metric}** ({verdicts.better_word(metric, groups)} is better) of each "
                f"value against the baseline ({bases}; `--baseline` picks another), within each setting "
                "of the other factors and pooled with the **seed as the unit**: per seed, the difference "
                "averaged over those settings, then the 95% t-interval over seeds (paired where both "
                "sides ran the same seeds, else Welch's over the per-seed means; `2 seeds x 2 settings`: "
                "each seed's difference is the mean over 2 settings). The box makes "
                f"**{box.comparisons} comparisons** (every pair of values within a factor); a difference "
                "is called, and ranked, only where it survives Holm's adjustment for all of them. An "
                "interval that contains 0: **no detectable difference**.",
            ),
            ("table", box.header, box.rows),
        ]
        verdict += [
            ("p", f"Ranking, only where the intervals separate after Holm's adjustment: {r}") for r in box.ranks
        ]
    return ("boxes", [("Verdict", verdict), ("Setup", [("table", ["held fixed", "value"], setup_rows(groups))])])


def overview(dirs, runs, groups, filters, target, defaults) -> list[tuple]:
    """What the report covers and how to read it, the main table and time to target."""
    where = ", ".join(f"`{d}`" for d in dirs)
    return [
        ("h", 2, "Groups and outcomes"),
        (
            "p",
            (
                f"{len(runs)} runs in {len(groups)} groups below {where}"
                + (f", filtered by {', '.join(f'`{f}`' for f in filters)}" if filters else "")
                + f". Grouped by {', '.join(f'`{k}`' for k in groups[0].settings) or 'nothing (one group)'}; "
                "seeds averaged. Losses: mean ± sample std over the completed runs, the mean rounded to the "
                "std's precision ('partial': none completed yet, so the runs so far); rows by mean best val "
                "loss, which is not a ranking (the verdict box above says which differences are detectable). "
                f"**Outcomes**: `learned` beat the no-context baseline (unigram entropy of the validation split) "
                f"by more than {STUCK_MARGIN:g} nats, `unstable` learned with loss spikes, `stuck` did not beat it, "
                "`diverged` was stopped by the trainer; running, interrupted, stopped (killed: resumable) and "
                "failed runs have none yet. "
                f"Target val loss: {_target_text(target, defaults)}."
            ),
        ),
        ("table", *tables.main_table(groups, target, defaults)),
        ("h", 2, "Time to target"),
        ("p", _target_note(groups, target, defaults)),
        ("table", *tables.target_table(groups, target, defaults)),
    ]


def unstarted_section(missing) -> list[tuple]:
    """The jobs of each half-finished sweep that never started (no directory, so in no table above)."""
    if not missing:
        return []
    blocks: list[tuple] = [("h", 2, "Jobs not started")]
    for sweep in missing:
        names = ", ".join(f"`{job}`" for job in sweep.jobs)
        blocks.append(
            (
                "p",
                f"Sweep `{sweep.sweep}`: {len(sweep.jobs)} of its {sweep.total} jobs never started "
                f"({names}). Finish the sweep (its stopped and interrupted jobs resume, completed ones "
                f"stay) with: `{sweep.command}`",
            )
        )
    return blocks


def _target_note(groups, target, defaults) -> str:
    """How time to target is measured, with the evaluation spacing, and a warning when that spacing is
    coarse against the spread of the step counts (then the table's steps resolve less than they show)."""
    spacing = eval_spacing([r for g in groups for r in g.runs])
    text = (
        "Steps, tokens and wall-clock seconds (since the run started, evaluation included) at which the val "
        "loss first reached the target, linearly interpolated between the two evaluations around the crossing; "
        "mean ± std over the runs that reached it."
    )
    if spacing is None:
        return text
    text += f" Evaluations every {spacing:g} steps: the crossing itself is only known to within {spacing:g} steps."
    spreads = tables.target_spreads(groups, target, defaults)
    if spreads and spacing > min(spreads):
        text += (
            f" **Coarse:** that spacing is wider than the spread of the step counts between seeds (std "
            f"{min(spreads):.0f}-{max(spreads):.0f} steps), so step differences below {spacing:g} are not "
            f"resolved; evaluate more often (e.g. `trainer.eval_every={max(1, int(spacing // 5))}`) to compare "
            "them."
        )
    return text


def layer_section(groups) -> list[tuple]:
    """Per-layer statistics at the end of training, when any completed run recorded them."""
    layer = tables.layer_table(groups)
    if not layer:
        return []
    return [
        ("h", 2, "Per-layer statistics at the end of training"),
        (
            "p",
            "From the last diagnostic record of each completed run: variance growth = Var(h_L) / "
            "Var(h_1) (after the last block over after the first); grad spread = first block's "
            "gradient norm / last block's; CV = std / mean of the per-block gradient norms; massive "
            f"ratio = max|h| / median|h| of the worst layer, its peak over the run and the first step "
            f"it exceeded {MASSIVE_THRESHOLD:g}; max |logit| of the output.",
        ),
        ("table", *layer),
    ]


def baseline_section(groups, baseline: str, base: tuple, target, defaults) -> list[tuple]:
    return [
        ("h", 2, f"Difference from {baseline}"),
        (
            "p",
            "Each group minus the group with the same settings but "
            f"`{baseline}`: difference of the means over seeds with Welch's 95% t-interval "
            "(needs two runs on each side). Negative loss or steps: better than the baseline.",
        ),
        ("table", *tables.baseline_table(groups, base[0], base[1][0], target, defaults)),
    ]


def lr_section(sweep) -> list[tuple]:
    return [
        ("h", 2, "Largest learning rate at which every seed learned"),
        (
            "p",
            "A learning rate counts when every run there with an outcome `learned` (not unstable, "
            "stuck or diverged); runs without an outcome (running, stopped, failed) are named in brackets.",
        ),
        ("table", *tables.lr_table(sweep)),
    ]


def optuna_sections(dirs: list[Path]) -> list[tuple]:
    """The best parameters of each Optuna search below ``dirs``: hydra/sweeper=optuna leaves
    optimization_results.yaml in its sweep dir, which may lie below the DIR given."""
    blocks: list[tuple] = []
    for d in dirs:
        for found in sorted(d.rglob("optimization_results.yaml")):
            optuna = load_yaml(found)
            if not (isinstance(optuna, dict) and "best_params" in optuna):
                continue
            best = ", ".join(f"`{k}={v}`" for k, v in (optuna.get("best_params") or {}).items())
            rel = "" if found.parent == d else f" ({found.parent.relative_to(d)})"
            blocks += [
                ("h", 2, f"Optuna search{rel}"),
                (
                    "p",
                    f"Best parameters: {best or DASH}; best value (best val loss): "
                    f"{optuna.get('best_value')}. Diverged trials count as 1e6, failed as inf.",
                ),
            ]
    return blocks
