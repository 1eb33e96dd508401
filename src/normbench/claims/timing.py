"""How a claim's timing test (tokens/s, seconds to target) is measured: from the paired benchmark that
``reproduce`` runs of its two sides in one process (normbench/claims/benchmark.py), never from the runs'
own wall clocks on a shared machine. Without a benchmark the test is reported, not judged."""

from __future__ import annotations

from normbench.claims import verdict as V

TIMING_METRICS = ("tokens_per_s", "seconds_to_target")


def timing_of(test, g_runs, b_runs, timing) -> dict | str | None:
    """A timing test's paired benchmark (a dict) or why there is none (a string); None for other tests.
    ``timing``: ``(test, group runs, baseline runs) -> benchmark``, or the reason none ran."""
    if test.metric not in TIMING_METRICS or b_runs is None:
        return None
    if timing is None or isinstance(timing, str):
        return timing or "no paired benchmark ran"
    return timing(test, g_runs, b_runs)


def value_of(test, target: float | None, g_runs, b_runs, bench, metric_value):
    """The metric of a run (``metric_value(run, metric, target)``); seconds to target with a benchmark: the
    run's steps to target x its side's median seconds per step in the benchmark."""
    if not (isinstance(bench, dict) and test.metric == "seconds_to_target"):
        return lambda r: metric_value(r, test.metric, target)
    per_step = bench["median_seconds_per_step"]
    side = {id(r): per_step["group"] for r in g_runs} | {id(r): per_step["baseline"] for r in b_runs}

    def value(r) -> float | None:
        steps = metric_value(r, "steps_to_target", target)
        return None if steps is None else steps * side[id(r)]

    return value


def round_tps(bench: dict, side: str) -> list[float]:
    """One side's tokens/s in each benchmark round."""
    return [bench["tokens_per_step"] / s for s in bench["seconds_per_step"][side]]


def timing_record(bench: dict | str, metric: str) -> dict:
    """verdict.json's record of how a timing test was measured; without a benchmark the test is reported,
    not judged (informative), whatever the runs' wall clocks say: they ran on a shared machine."""
    if isinstance(bench, dict):  # tokens/s: the interval is over the benchmark's rounds, not the seeds
        rounds = {"interval": "paired over benchmark rounds"} if metric == "tokens_per_s" else {}
        return {"timing": "paired benchmark", "benchmark": bench, **rounds}
    why = f"not judged: {bench}; the runs' own wall clocks on a shared machine are not a measurement"
    return {
        "timing": "runs' wall clocks",
        "timing_reason": bench,
        "informative": True,
        "verdict": V.INCONCLUSIVE,
        "reason": why,
    }
