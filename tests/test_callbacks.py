"""The trainer's callback protocol (train/callbacks.py): hooks in the step's order, log steps planned for the
records a callback writes into, and the trainer's own diagnostics and validation behind the same protocol."""

from __future__ import annotations

from normbench.run.metrics import read_jsonl
from normbench.train import trainer
from normbench.train.callbacks import Callback, Diagnose, Validate

from conftest import compose

HOOKS = ("pre_step", "pre_clip", "pre_optim_step", "post_optim_step")


class Probe(Callback):
    """Records every hook call; writes ``probe/step`` into the records of steps 3 and 7."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def wants_record(self, step: int) -> bool:
        return step in (3, 7)

    def pre_step(self, step):
        self.calls.append(("pre_step", step))

    def pre_clip(self, step):
        self.calls.append(("pre_clip", step))

    def pre_optim_step(self, step):
        self.calls.append(("pre_optim_step", step))

    def post_optim_step(self, step):
        self.calls.append(("post_optim_step", step))

    def on_record(self, step, record, diverged):
        self.calls.append(("on_record", step))
        if self.wants_record(step):
            record["probe/step"] = float(self.trainer.step)


def test_hooks_run_in_the_steps_order_and_the_records_they_ask_for_are_logged(tmp_path):
    probe = Probe()
    overrides = ["model=tiny", "trainer.batch_size=4", "trainer.max_steps=8", "trainer.log_every=100"]
    cfg = compose([*overrides, "trainer.eval_every=100", "diag=off"])
    trainer.run(cfg, tmp_path, callbacks=[probe])
    per_step = [c for c in probe.calls if c[0] != "on_record"]
    assert per_step == [(hook, step) for step in range(1, 9) for hook in HOOKS]
    records = read_jsonl(tmp_path / "metrics.jsonl")
    # log steps: the first and last (validation), and the probe's 3 and 7; nothing else at log_every=100
    assert [r["step"] for r in records] == [1, 3, 7, 8]
    assert [("on_record", r["step"]) for r in records] == [c for c in probe.calls if c[0] == "on_record"]
    assert {r["step"]: r.get("probe/step") for r in records} == {1: None, 3: 3.0, 7: 7.0, 8: None}
    assert "val_loss" in records[0] and "val_loss" in records[-1] and "val_loss" not in records[1]


def test_the_trainers_own_parts_are_callbacks(tmp_path):
    """Diagnostics and validation are the first two callbacks, the caller's come after them."""
    probe = Probe()
    t = trainer.Trainer(compose(["model=tiny", "trainer.max_steps=4", "diag.every=2"]), tmp_path, [probe])
    t.setup()
    try:
        kinds = [type(cb) for cb in t.loop.callbacks]
        assert kinds == [Diagnose, Validate, Probe] and probe.trainer is t
        diag = t.loop.callbacks[0]
        assert [s for s in range(1, 5) if diag.wants_record(s)] == [1, 2, 4]  # first, every 2, last
    finally:
        t.close()
