"""A claim's timing tests from a paired benchmark, not from the runs' wall clocks (docs/claims.md, "Timing").

The runs of a sweep train one after another (or two at a time) on a machine that other work shares,
so their tokens/s measure the machine as much as the model: one quick sweep read 600-2,270 tok/s
within one side. Here the two sides' training steps are timed in one process, interleaved: ``rounds``
rounds, each timing ``steps`` steps of one side and then of the other (A B, then B A, ...), after
``warmup`` untimed steps of each. The machine's drift then hits both sides of a round alike; the
rounds are the unit of the interval (a paired t-interval over the per-round log ratios, the rule of
:mod:`.verdict`). The idea and the step are scripts/bench_throughput.py's paired suite: the model's own
step (forward, backward, clip, optimizer, nGPT's re-normalization) on one fixed batch, without the
trainer's data loading, logging and evaluation; eager whatever the runs' ``compile`` (recorded beside as
``runs_compile``): a compile per side would cost more than the benchmark on a CPU.

How each timing metric is judged from it (:func:`normbench.claims.measure.judge_test`):

- ``tokens_per_s``: each round gives each side's tokens per second; the test's values are those, paired
  by round.
- ``seconds_to_target``: seconds to target = steps to target (each run's, from the sweep) x seconds per
  step (the side's median over the benchmark's rounds). The interval is then over seeds, with the
  per-step times taken as known; the benchmark's own ratio and interval are recorded beside.

The load of the machine (``os.getloadavg`` before and after, the cores, torch's threads) is recorded
with the result, in verdict.json's ``benchmark`` of the test.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from omegaconf import OmegaConf

from normbench.analysis.stats import interval
from normbench.claims.timing import TIMING_METRICS  # noqa: F401 - the metrics a benchmark times
from normbench.errors import ConfigError

DEFAULT = "5x10"  # reproduce's bench=: rounds x steps per side
WARMUP = 3
VOCAB = {"byte": 256, "gpt2": 50257}


@dataclass(frozen=True)
class Plan:
    """How long the benchmark runs: ``rounds`` rounds of ``steps`` timed steps per side, after ``warmup``."""

    rounds: int = 5
    steps: int = 10
    warmup: int = WARMUP


def parse_plan(text: str | None) -> Plan | None:
    """``bench=5x10`` (rounds x steps per side) as a :class:`Plan`; ``bench=off``: None (no benchmark)."""
    text = DEFAULT if text is None else str(text)
    if text in ("off", "false"):
        return None
    rounds, sep, steps = text.partition("x")
    if not (sep and rounds.isdigit() and steps.isdigit() and int(rounds) >= 3 and int(steps) >= 1):
        raise ConfigError(f"bench={text} is not allowed; give ROUNDSxSTEPS with 3 or more rounds (e.g. 5x10), or off")
    return Plan(int(rounds), int(steps))


def machine_load() -> dict:
    """The 1/5/15-minute load averages, the cores and torch's threads: how busy the machine was."""
    import torch  # deferred (start-up time): torch

    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"loadavg": load, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def _vocab(cfg) -> int:
    from normbench.model import padded_vocab  # deferred (start-up time): torch

    data = cfg.data.vocab_size or VOCAB.get(str(cfg.data.tokenizer), 50257)
    return padded_vocab(cfg, int(data))


def stepper(cfg, device, seed: int = 0) -> Callable[[], None]:
    """One training step of ``cfg``'s model on one fixed random batch."""
    return model_stepper(cfg, _vocab(cfg), device, seed)[1]


def model_stepper(cfg, vocab: int, device, seed: int = 0):
    """(model, step): ``step()`` trains ``cfg``'s model one step on one fixed random batch (forward, backward,
    clip, optimizer, nGPT's re-normalization); the one step scripts/bench's suites time too."""
    import torch  # deferred (start-up time): torch

    from normbench.model import build_model  # deferred (start-up time): torch
    from normbench.optim.optimizers import build_optimizer  # deferred (start-up time): torch
    from normbench.runtime.precision import autocast_dtype  # deferred (start-up time): torch

    torch.manual_seed(seed)
    model = build_model(cfg, vocab).to(device)
    opt = build_optimizer(model, cfg, log=lambda *a: None)
    batch = torch.randint(0, vocab, (cfg.trainer.batch_size, cfg.model.seq_len + 1), device=device)
    dtype = autocast_dtype(cfg)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if hasattr(model, "after_step"):
            model.after_step()

    return model, step


def interleave(steps: dict[str, Callable[[], None]], plan: Plan, sync=lambda: None) -> dict[str, list[float]]:
    """Seconds per step of each named side, one value per round; the sides take turns being first."""
    names = list(steps)
    for name in names:
        for _ in range(plan.warmup):
            steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(plan.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sync()
            t0 = time.perf_counter()
            for _ in range(plan.steps):
                steps[name]()
            sync()
            times[name].append((time.perf_counter() - t0) / plan.steps)
    return times


def summarize(seconds: dict[str, list[float]], tokens_per_step: int) -> dict:
    """Per side its seconds per step (per round, median); the group's tokens/s over the baseline's as a
    geometric mean over rounds with its paired 95% interval (``ratio``, ``ratio_ci``)."""

    g, b = seconds["group"], seconds["baseline"]
    effect, (lo, hi) = interval([-math.log(s) for s in g], [-math.log(s) for s in b], paired=True)
    return {
        "seconds_per_step": {side: [round(s, 6) for s in v] for side, v in seconds.items()},
        "median_seconds_per_step": {side: statistics.median(v) for side, v in seconds.items()},
        "tokens_per_step": tokens_per_step,
        "ratio": math.exp(effect),
        "ratio_ci": [math.exp(lo), math.exp(hi)],
    }


def measure(cfg_group, cfg_baseline, plan: Plan) -> dict:
    """The paired benchmark of two composed configs: :func:`summarize`'s numbers, the plan, the device and the
    machine's load before and after."""
    import torch  # deferred (start-up time): torch

    device = torch.device("cuda" if str(cfg_group.device) != "cpu" and torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    before = machine_load()
    steps = {"group": stepper(cfg_group, device), "baseline": stepper(cfg_baseline, device)}
    seconds = interleave(steps, plan, sync)
    after = machine_load()
    tokens = cfg_group.trainer.batch_size * cfg_group.model.seq_len
    load = {
        "loadavg_before": before["loadavg"],
        "loadavg_after": after["loadavg"],
        "cpu_count": after["cpu_count"],
        "torch_threads": after["torch_threads"],
    }
    compiled = {"compile": False, "runs_compile": [c.compile for c in (cfg_group, cfg_baseline)]}
    return {**summarize(seconds, tokens), "plan": asdict(plan), "device": device.type, **compiled, "load": load}


def _config(run):
    """The run's composed config (its .hydra/config.yaml) as a validated config, or None."""

    from normbench.validation import to_config  # deferred (start-up time): torch

    if not run.config or "model" not in run.config:
        return None
    return to_config(OmegaConf.create(run.config))


def timing(plan: Plan | None, why_not: str | None = None, log=print):
    """What :func:`normbench.claims.measure.judge_claim` calls for a timing test: ``(test, group runs,
    baseline runs) -> benchmark dict``, or a string saying why no benchmark ran. The configs are those of
    each side's first run (the sides' seeds share a config but for the seed); one benchmark per pair."""
    if plan is None or why_not:
        return why_not or "no paired benchmark ran (bench=off)"
    done: dict[tuple, dict | str] = {}

    def run(test, g_runs, b_runs) -> dict | str:
        if not g_runs or not b_runs:
            return "no paired benchmark ran: a side has no runs"
        g, b = (min(rs, key=lambda r: str(r.path)) for rs in (g_runs, b_runs))
        key = (str(g.path), str(b.path))
        if key not in done:
            cfgs = _config(g), _config(b)
            if None in cfgs:
                done[key] = "no paired benchmark ran: a side's run has no composed config"
            else:
                log(
                    f"normbench: paired benchmark for '{test.name}': {plan.rounds} rounds x {plan.steps} steps per side"
                )
                done[key] = measure(*cfgs, plan)
        return done[key]

    return run
