"""Fault-injection hooks for the tests, kept out of the package.

Loaded in-process by conftest.py and, in the ``python -m normbench`` subprocesses the tests start,
through ``NORMBENCH_PLUGINS=normbench_test_hooks`` (normbench.cli imports the modules it names; conftest.py
puts this directory on ``PYTHONPATH``). Each hook wraps one of the trainer's extension points and
does nothing unless its environment variable is set (read at each call, so ``monkeypatch.setenv``
works in-process):

- ``NORMBENCH_TEST_NAN_GRAD=3,5``: the gradients of those steps (1-based) are made NaN;
- ``NORMBENCH_TEST_HANG_AT_STEP=n``: step n never ends (sleeps an hour after its backward);
- ``NORMBENCH_TEST_SLOW_EVAL=s``: each validation batch of the last step's evaluation takes s seconds more;
- ``NORMBENCH_TEST_SLOW_LOG=s``: each metrics record is followed by an s-second sleep (a signal lands mid-run);
- ``NORMBENCH_TEST_FAIL_AT_STEP=n``: writing the record of step n raises RuntimeError (a crash mid-run);
- ``NORMBENCH_TEST_SLOW_CKPT=s``: a checkpoint write stops halfway for s seconds (kill -9 mid-write);
- ``NORMBENCH_TEST_SLOW_WRITE=name:s``: an atomic write of ``name`` (``summary.json``, ``metrics.jsonl``)
  waits s seconds with its temp file written, before the rename (kill -9 mid-write);
- ``NORMBENCH_TEST_MEMORY_LIMIT_GB=g``: the device appears to have g GB (memory.check's refusal).
"""

from __future__ import annotations

import io
import os
import time

import torch


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def install() -> None:
    from normbench.run import metrics
    from normbench.runtime import memory
    from normbench.train import checkpoint, trainer

    if getattr(trainer.Trainer, "_test_hooks", False):
        return
    trainer.Trainer._test_hooks = True

    forward_backward = trainer.Trainer.forward_backward

    def forward_backward_hooked(self, micro_batches):
        loss_sum = forward_backward(self, micro_batches)
        if _env("NORMBENCH_TEST_HANG_AT_STEP") and self.step + 1 == int(_env("NORMBENCH_TEST_HANG_AT_STEP")):
            time.sleep(3600)
        nan_steps = {int(v) for v in _env("NORMBENCH_TEST_NAN_GRAD").split(",") if v.strip()}
        if self.step + 1 in nan_steps:
            next(p for p in self.raw_model.parameters() if p.grad is not None).grad.fill_(float("nan"))
        return loss_sum

    eval_loss = trainer.Trainer.eval_loss

    def eval_loss_hooked(self, batch):
        if _env("NORMBENCH_TEST_SLOW_EVAL") and self.step == self.max_steps:
            time.sleep(float(_env("NORMBENCH_TEST_SLOW_EVAL")))
        return eval_loss(self, batch)

    write = metrics.JsonlWriter.write

    def write_hooked(self, record):
        fail_at = _env("NORMBENCH_TEST_FAIL_AT_STEP")
        if fail_at and record.get("step") == int(fail_at):
            raise RuntimeError(f"NORMBENCH_TEST_FAIL_AT_STEP: simulated crash at step {fail_at}")
        write(self, record)
        if _env("NORMBENCH_TEST_SLOW_LOG"):
            time.sleep(float(_env("NORMBENCH_TEST_SLOW_LOG")))

    serialize = checkpoint.serialize

    def serialize_hooked(state, f):
        if not _env("NORMBENCH_TEST_SLOW_CKPT"):
            return serialize(state, f)
        buf = io.BytesIO()  # a torn temp file exists for that long
        torch.save(state, buf)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        time.sleep(float(_env("NORMBENCH_TEST_SLOW_CKPT")))
        f.write(data[len(data) // 2 :])

    write_atomic = metrics.write_atomic

    def write_atomic_hooked(path, write, binary=False):
        name, _, seconds = _env("NORMBENCH_TEST_SLOW_WRITE").partition(":")

        def write_then_wait(f):
            write(f)
            f.flush()
            time.sleep(float(seconds))

        slow = name and os.path.basename(path) == name
        return write_atomic(path, write_then_wait if slow else write, binary)

    available = memory.available

    def available_hooked(device):
        if _env("NORMBENCH_TEST_MEMORY_LIMIT_GB"):
            return float(_env("NORMBENCH_TEST_MEMORY_LIMIT_GB")) * memory.GB, "the test limit"
        return available(device)

    trainer.Trainer.forward_backward = forward_backward_hooked
    trainer.Trainer.eval_loss = eval_loss_hooked
    metrics.JsonlWriter.write = write_hooked
    checkpoint.serialize = serialize_hooked
    metrics.write_atomic = write_atomic_hooked
    memory.available = available_hooked


install()  # imported as a plugin (NORMBENCH_PLUGINS) or by conftest.py
