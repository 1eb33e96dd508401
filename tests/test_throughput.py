"""Honest speed (issue 51): tokens/s and MFU from the wall clock between log steps' syncs (runtime/throughput.py),
checked with a fake clock and a fake device whose queued work the sync waits for."""

from __future__ import annotations

import pytest
import torch

from normbench.runtime.flops import mfu
from normbench.runtime.throughput import WARMUP_STEPS, Throughput

TOKENS = 1000  # per step
H, G = 0.3, 1.0  # host seconds to queue a step, device seconds to run it: the host runs ahead of the device


class FakeDevice:
    """A clock, and a device that runs queued steps one after another; ``sync`` waits for them all."""

    def __init__(self):
        self.t, self.busy_until = 0.0, 0.0

    def clock(self) -> float:
        return self.t

    def queue_step(self) -> None:
        self.t += H  # the host's work
        self.busy_until = max(self.busy_until, self.t) + G

    def sync(self) -> None:
        self.t = max(self.t, self.busy_until)


def run(meter: Throughput, dev: FakeDevice, steps: range, log_every: int, lagged_read_every: int = 0) -> list:
    """The trainer's loop, as the meter sees it: per step ``step_start``, the work, a log step's ``window``; a stop
    vote read every ``lagged_read_every`` steps waits for the device outside any step (the DDP case of issue 51)."""
    rates = []
    for step in steps:
        meter.step_start(step)
        dev.queue_step()
        done = step + 1
        if done % log_every == 0:
            rates.append((*meter.window(done), dev.t))  # (tokens/s, s/step, the wall clock after the sync)
        elif lagged_read_every and done % lagged_read_every == 0:
            dev.sync()
    return rates


def test_the_rate_is_tokens_over_the_wall_time_between_log_steps_waits_included():
    dev = FakeDevice()
    meter = Throughput(TOKENS, torch.device("cpu"), clock=dev.clock, sync=dev.sync)
    meter.start(0)
    rates = run(meter, dev, range(40), log_every=20, lagged_read_every=5)
    # exactly the tokens over the wall time between the two log steps' syncs, the waits at the reads included
    (_, _, t20), (tps, step_time, t40) = rates
    assert tps == pytest.approx(20 * TOKENS / (t40 - t20))
    assert step_time == pytest.approx((t40 - t20) / 20)
    # which is the device's 20 G, plus its idle H after each of the 4 syncs (steps 20, 25, 30, 35)
    assert t40 - t20 == pytest.approx(20 * G + 4 * H)
    assert rates[0][0] == pytest.approx(20 * TOKENS / t20)  # the first window runs from the start
    # the steady state: from the sixth step on (after its sync), the same wall-clock rate
    tps, step_time = meter.steady()
    elapsed = dev.t - (WARMUP_STEPS * G + H)  # the sync before step 6 waited for the first five steps
    assert tps == pytest.approx((40 - WARMUP_STEPS) * TOKENS / elapsed)
    assert step_time == pytest.approx(elapsed / (40 - WARMUP_STEPS))


def test_evaluation_and_checkpoint_seconds_are_left_out_and_mfu_stays_below_one():
    dev = FakeDevice()
    meter = Throughput(TOKENS, torch.device("cpu"), clock=dev.clock, sync=dev.sync)
    meter.start(0)
    ((_, _, t10),) = run(meter, dev, range(10), log_every=10)
    dev.t += 7.0  # an evaluation after the log step (timed from the sync by the trainer)
    meter.spent("eval_s", 7.0)
    run(meter, dev, range(10, 15), log_every=10)
    dev.sync()
    dev.t += 3.0  # a checkpoint between log steps
    meter.spent("ckpt_s", 3.0)
    tps, _, t20 = run(meter, dev, range(15, 20), log_every=10)[0]
    assert tps == pytest.approx(10 * TOKENS / (t20 - t10 - 10.0))  # the 10 s of eval and ckpt left out
    assert t20 - t10 - 10.0 == pytest.approx(10 * G + 2 * H)  # the device idles H after each sync (10, 15)
    # a device that does flops_per_token x TOKENS / G FLOP/s at its peak: MFU is at most 1
    flops_per_token = 6e6
    peak = flops_per_token * TOKENS / G
    assert 0.9 < mfu(flops_per_token, tps, peak) <= 1.0


def test_a_lagged_read_outside_the_steps_no_longer_inflates_the_rate():
    """Issue 51's arithmetic: timing only step_start..step_end (a sync at log steps only) credited a window of n
    steps with (n-1) h + G seconds when a read between log steps waited for the device: ~2.7x at n = 10, h = 0.3 G.
    From the wall clock, the rate is the device's: tokens / (n G), whatever the reads between."""
    dev = FakeDevice()
    meter = Throughput(TOKENS, torch.device("cpu"), clock=dev.clock, sync=dev.sync)
    meter.start(0)
    rates = run(meter, dev, range(100), log_every=10, lagged_read_every=1)
    for (_, _, t0), (tps, _, t1) in zip(rates, rates[1:]):
        assert tps == pytest.approx(10 * TOKENS / (t1 - t0))  # not 10 x TOKENS / (9 H + G): 2.7x the device's
        assert tps <= TOKENS / G  # the device's own rate bounds it
    assert mfu(1.0, max(r[0] for r in rates), TOKENS / G) <= 1.0


def test_the_clock_goes_on_across_a_resume():
    dev = FakeDevice()
    meter = Throughput(TOKENS, torch.device("cpu"), clock=dev.clock, sync=dev.sync)
    meter.start(0)
    run(meter, dev, range(20), log_every=10)
    saved = meter.state_dict()
    dev2 = FakeDevice()
    dev2.t = 1000.0  # another process
    again = Throughput(TOKENS, torch.device("cpu"), clock=dev2.clock, sync=dev2.sync)
    again.load_state_dict(saved)
    again.start(20)
    assert again.wall() == pytest.approx(saved["wall_s"])
    run(again, dev2, range(20, 40), log_every=10)
    tps, _ = again.steady()
    assert tps == pytest.approx(TOKENS / G, rel=0.05)  # both segments' steady steps, at the device's rate


def test_spending_adds_the_blocks_seconds_on_the_meters_clock():
    """``spending`` times a block on the meter's own clock (the one its windows use), even when the block raises."""
    ticks = iter([0.0, 10.0, 12.5, 20.0, 21.0])
    meter = Throughput(100, torch.device("cpu"), clock=lambda: next(ticks))  # 0.0: its start
    with meter.spending("eval_s"):  # 10.0 -> 12.5
        pass
    with pytest.raises(RuntimeError), meter.spending("diag_s"):  # 20.0 -> 21.0
        raise RuntimeError("the block fails")
    assert (meter.clock["eval_s"], meter.clock["diag_s"]) == (2.5, 1.0)
