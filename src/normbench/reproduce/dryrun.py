"""What ``reproduce ID --dry-run`` prints: each test's two sides with their run counts, each sweep's run
count, estimated time and command, quoted so that it runs when pasted into a POSIX shell."""

from __future__ import annotations

import shlex

from normbench.reproduce.claims import Claim, override_key


def command(argv: list[str]) -> str:
    """The sweep as a shell command (``${hydra.job.override_dirname}`` and ``[a,b]`` quoted for bash)."""
    return " ".join(shlex.quote(a) for a in ["python", "-m", "normbench", "train", *argv])


def _spell(value) -> str:
    from normbench.report.loading import norm_value
    from normbench.reproduce.claims import as_str

    return norm_value(as_str(value))


def side_runs(where: dict, jobs: list[list[dict]], fixed: list[str]) -> int:
    """How many planned runs (seeds included) a test side selects: a job's grid value for a key, else the
    claim's fixed setting of it; a key set by neither is the config default, which the side then shares."""
    preset = {override_key(o): o.split("=", 1)[1] for o in fixed if "=" in o}
    n = 0
    for sweep in jobs:
        for job in sweep:
            values = {**preset, **job}
            n += all(k not in values or _spell(values[k]) == _spell(v) for k, v in where.items())
    return n


def _named(where: dict) -> str:
    return " ".join(f"{k}={_spell(v)}" for k, v in where.items()) or "every run"


def sides_line(claim: Claim, test, inits: dict[str, list[float]], jobs, fixed: list[str]) -> str:
    """``test 'NAME': norm=rmsnorm (3 runs) against norm=layernorm (3 runs), both from init_std 0.06928``."""
    at = dict(test.at)
    group = f"{_named({**at, **test.group})} ({side_runs({**at, **test.group}, jobs, fixed)} runs)"
    if isinstance(test.baseline, dict):
        base = f"{_named({**at, **test.baseline})} ({side_runs({**at, **test.baseline}, jobs, fixed)} runs)"
    else:
        base = f"the number {test.baseline}"
    g, b = inits.get("group", []), inits.get("baseline", [])
    shown = lambda vals: ", ".join(f"{v:.4g}" for v in vals)  # noqa: E731
    init = f"both from init_std {shown(g)}" if g == b or not b else f"init_std {shown(g)} against {shown(b)}"
    return f"test '{test.name}': {group} against {base}, {init}"


def sweep_estimate(claim: Claim, scale: str, overrides: list[str], grid: dict[str, list[str]],
                   n_runs: int) -> tuple[str, float]:  # fmt: skip
    """(``about 40 s on this machine's CPU (estimate)``, seconds) for one sweep: each grid point composed
    once, its time counted once per seed."""
    import itertools

    from normbench.reproduce.estimate import SWEEP_START_S, calibration_note, job_seconds, spoken
    from normbench.reproduce.shared import compose
    from normbench.train.validation import to_config

    fixed = claim.settings(scale, overrides)
    keys = [k for k in grid if k != "seed"]
    combos = list(itertools.product(*(grid[k] for k in keys)))
    total, where = 0.0, "CPU"
    for combo in combos:
        cfg = to_config(compose(claim, [*fixed, *(f"{k}={v}" for k, v in zip(keys, combo))], dict(zip(keys, combo))))
        seconds, where = job_seconds(cfg)
        total += seconds * n_runs / max(1, len(combos))
    note = calibration_note(where)
    return f"{spoken(total + SWEEP_START_S)} on this machine's {where} (estimate{note})", total + SWEEP_START_S
