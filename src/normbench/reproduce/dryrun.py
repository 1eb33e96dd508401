"""What ``reproduce ID --dry-run`` prints: each test's two sides with their run counts, each sweep's run
count, estimated time and command, quoted so that it runs when pasted into a POSIX shell."""

from __future__ import annotations

import shlex

from normbench.claims.registry import Claim, as_str, override_key
from normbench.config.spec import spec_of


def command(argv: list[str]) -> str:
    """The sweep as a shell command (``${hydra.job.override_dirname}`` and ``[a,b]`` quoted for bash), with
    the threads setting the runner gives it (plan.threads_env: jobs=N)."""
    from normbench.reproduce.plan import threads_env  # deferred (start-up time): hydra, numpy

    env = [f"{k}={v}" for k, v in threads_env(argv).items()]
    return " ".join([*env, *(shlex.quote(a) for a in ["python", "-m", "normbench", "train", *argv])])


def _spell(value) -> str:
    from normbench.analysis.loading import norm_value  # deferred (start-up time): hydra, numpy

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
    shown = lambda vals: ", ".join(f"{v:.4g}" for v in vals)
    init = f"both from init_std {shown(g)}" if g == b or not b else f"init_std {shown(g)} against {shown(b)}"
    return f"test '{test.name}': {group} against {base}, {init}"


def lr_line(claim: Claim, jobs: list) -> str:
    """``hidden-matrix lr 0.0072 on every run (optim.lr=auto (0.0006 x 768/64))``: the peak LR the claim's
    composed ``jobs`` ((values, config) pairs) give their hidden matrices, and where it came from."""
    specs = [spec_of(cfg) for _, cfg in jobs]  # planned jobs are composed, not prepared: their spec resolved here
    lrs = sorted({spec.matrix_lr for spec in specs})
    sources = sorted({spec.lr_source for spec in specs})
    where = (
        f" ({sources[0]})" if len(sources) == 1 else f" (optim.lr: {', '.join(sources)})" if len(sources) < 4 else ""
    )
    if len(lrs) == 1:
        return f"hidden-matrix lr {lrs[0]:.4g} on every run{where}"
    return f"hidden-matrix lr {', '.join(f'{x:.4g}' for x in lrs)} across the runs{where}"


def sweep_estimate(cfgs: list, n_runs: int) -> tuple[str, float]:
    """(``about 40 s on this machine's CPU (estimate)``, seconds) for one sweep of ``n_runs`` runs over the
    grid points ``cfgs`` (the plan's composed configs, reproduce/plan.py): each one's time counted once
    per seed."""
    from normbench.reproduce.estimate import (  # deferred (start-up time): hydra, numpy
        SWEEP_START_S,
        calibration_note,
        job_seconds,
        spoken,
    )
    from normbench.validation import to_config  # deferred (start-up time): hydra, numpy

    total, where = 0.0, "CPU"
    for cfg in cfgs:
        seconds, where = job_seconds(to_config(cfg))
        total += seconds * n_runs / max(1, len(cfgs))
    note = calibration_note(where)
    return f"{spoken(total + SWEEP_START_S)} on this machine's {where} (estimate{note})", total + SWEEP_START_S
