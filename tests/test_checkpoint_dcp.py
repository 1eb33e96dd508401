"""Checkpoints off the critical path (issue 51): sharded DCP (train/sharded.py), which checkpoint is the run's
(train/ckpt_store.py), background writes (train/ckpt_writer.py), checkpoints by time, FSDP2's mixed precision
and activation checkpointing (runtime/distributed.py). In one process; the torchrun ones are in
tests/test_distributed.py."""

from __future__ import annotations

import pickle
import time

import pytest
import torch

from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.optim.optimizers import build_optimizer
from normbench.runtime import distributed as du
from normbench.train import checkpoint, ckpt_store, sharded, trainer
from normbench.train.loop_parts import Checkpoints

from conftest import TINY, compose

RESUMABLE = [*TINY, "sched=constant", "sched.warmup_steps=0", "trainer.log_every=1", "diag=off", "model.dropout=0.1"]


def _trained(cfg, seed: int = 0, steps: int = 2):
    torch.manual_seed(seed)
    model = build_model(cfg, 256)
    opt = build_optimizer(model, cfg, log=lambda *_: None)
    idx = torch.randint(0, 256, (2, 8))
    for _ in range(steps):
        model(idx, idx)[1].backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _extra(step: int) -> dict:
    return {"step": step, "tokens": 10 * step, "sampler_rng": torch.arange(3), "torch_rng": torch.get_rng_state()}


def test_a_sharded_checkpoint_round_trips_and_is_a_candidate_only_once_complete(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    model, opt = _trained(cfg)
    final = sharded.path_for(tmp_path, 2)
    sharded.save(final, sharded.tensors(model, opt), _extra(2))
    assert sorted(p.name for p in final.iterdir()) == [".metadata", "__0_0.distcp", "extra.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2.dcp"], "the temp directory was renamed"
    assert ckpt_store.latest(tmp_path) == final
    fresh, fresh_opt = _trained(cfg, seed=1, steps=0)
    extra = sharded.read_extra(final)
    assert extra["step"] == 2 and extra["optimizer_saved"]
    sharded.load_into(final, fresh, fresh_opt, extra["optimizer_saved"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k
    a, b = du.full_state_dicts(model, opt)[1], du.full_state_dicts(fresh, fresh_opt)[1]
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for name, slots in a["state"].items():
        assert all(torch.equal(v, b["state"][name][k]) for k, v in slots.items()), name
    # read in one process as the single file's flat dict (export, sample)
    flat = ckpt_store.load(final)
    assert flat["step"] == 2 and all(torch.equal(v, flat["model"][k]) for k, v in model.state_dict().items())
    # a write that never finished: a temp directory, never a candidate; the next save removes it
    (tmp_path / ".step_4.dcp.tmp").mkdir()
    assert ckpt_store.latest(tmp_path) == final
    sharded.save(sharded.path_for(tmp_path, 3), sharded.tensors(model, opt), _extra(3))
    assert not (tmp_path / ".step_4.dcp.tmp").exists()


def test_a_damaged_sharded_checkpoint_is_refused_in_one_line(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    model, opt = _trained(cfg)
    final = sharded.path_for(tmp_path, 2)
    sharded.save(final, sharded.tensors(model, opt), _extra(2))
    shard = final / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=r"its shard __0_0.distcp is truncated \(\d+ of \d+ bytes\)") as refused:
        sharded.load_into(final, model, opt, True)
    assert len(str(refused.value).splitlines()) == 1 and str(refused.value).startswith(f"checkpoint {final} ")
    shard.unlink()
    with pytest.raises(ConfigError, match="its shard __0_0.distcp is missing"):
        sharded.load_into(final, model, opt, True)
    # an index that would run code when unpickled (DCP reads it with plain pickle) is never run
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (final / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(
        ConfigError, match=r"its .metadata holds pickled objects other than DCP's metadata \(io\.open\)"
    ):
        sharded.verify(final)
    assert not marker.exists()
    extra = final / "extra.pt"
    raw = bytearray(extra.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    extra.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="CRC-32|corrupt"):
        sharded.read_extra(final)


def test_the_runs_checkpoint_is_the_newest_of_either_format(tiny_cfg, tmp_path):
    model, opt = _trained(tiny_cfg())
    full = {"model": model.state_dict(), "optimizer": {}, **_extra(5)}
    checkpoint.save_atomic(full, tmp_path / "last.pt")
    for step in (4, 6):
        sharded.save(sharded.path_for(tmp_path, step), sharded.tensors(model, opt), _extra(step))
    assert ckpt_store.latest(tmp_path) == tmp_path / "step_6.dcp"
    ckpt_store.prune(tmp_path, tmp_path / "step_6.dcp", keep=frozenset({4}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4.dcp", "step_6.dcp"], "last.pt is superseded"
    checkpoint.save_atomic({**full, "step": 7}, tmp_path / "last.pt")
    assert ckpt_store.latest(tmp_path) == tmp_path / "last.pt"
    (tmp_path / "last.pt").write_bytes(b"torn")  # unreadable: chosen, so that the resume refuses it loudly
    assert ckpt_store.latest(tmp_path) == tmp_path / "last.pt"
    ckpt_store.set_aside(tmp_path)  # a fresh run: nothing left to resume, nothing deleted
    assert ckpt_store.latest(tmp_path) is None and len(list(tmp_path.glob("replaced-*"))) == 3


def _weights(run_dir):
    return checkpoint.load(run_dir / "checkpoints" / "last.pt")["model"]


@pytest.mark.slow
def test_a_background_checkpoint_resumes_bit_for_bit(tmp_path, monkeypatch):
    """trainer.ckpt_async: the step-2 checkpoint is written while steps 3 and 4 train (the write is slowed so
    that they change the parameters under it); the run crashes at step 4; the resume from step 2 ends
    exactly as an uninterrupted run (weights, losses, dropout's stream)."""
    whole = tmp_path / "whole"
    trainer.run(compose([*RESUMABLE, "trainer.max_steps=6"]), whole)
    save = checkpoint.save_atomic

    def slow_save(state, path):
        time.sleep(0.5)
        save(state, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_save)
    monkeypatch.setenv("NORMBENCH_TEST_FAIL_AT_STEP", "4")
    part = tmp_path / "part"
    args = [*RESUMABLE, "trainer.max_steps=6", "trainer.ckpt_every=2", "trainer.ckpt_async=true"]
    with pytest.raises(RuntimeError, match="simulated crash at step 4"):
        trainer.run(compose(args), part)
    assert checkpoint.load(part / "checkpoints" / "last.pt")["step"] == 2
    monkeypatch.delenv("NORMBENCH_TEST_FAIL_AT_STEP")
    s = trainer.run(compose([*args, "trainer.resume=true"]), part)
    assert s["status"] == "completed" and s["ckpt_s"] > 0
    got, ref = _weights(part), _weights(whole)
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_checkpoints_by_time_are_asked_at_log_steps(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    cp = Checkpoints(None, max_steps=50, keep=(7,), every_s=60.0)
    cpu = torch.device("cpu")
    assert not cp.due(10) and cp.due(7)  # no step interval; a save_at step always
    now[0] += 59.0
    assert not cp.time_due(10, cpu)
    now[0] += 1.0
    assert cp.time_due(10, cpu) and not cp.time_due(50, cpu), "never at the last step: it checkpoints anyway"
    cp.saved()
    assert not cp.time_due(11, cpu)
    assert not Checkpoints(None, 50, every_s=0).time_due(10, cpu), "0: off"


def test_async_checkpointing_on_a_torch_without_it_is_one_line(monkeypatch):
    import torch.distributed.checkpoint as dcp

    from normbench.train import ckpt_writer

    monkeypatch.delattr(dcp, "async_save")
    with pytest.raises(ConfigError, match=r"trainer.ckpt_async=true needs torch.distributed.checkpoint.async_save"):
        ckpt_writer.check_async_available()


def test_fsdp_mixed_precision_follows_the_runs_precision(tiny_cfg):
    policy = du.mixed_precision(tiny_cfg("precision=bf16"))
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert du.mixed_precision(tiny_cfg("precision=fp32")) is None


@pytest.mark.slow
def test_activation_checkpointing_gives_the_same_numbers(tmp_path):
    """Recomputed blocks (dropout's RNG replayed): the same losses and weights to the bit; parameter names kept."""
    args = [*RESUMABLE, "trainer.max_steps=3"]
    trainer.run(compose(args), tmp_path / "plain")
    trainer.run(compose([*args, "trainer.activation_checkpointing=true"]), tmp_path / "ac")
    a, b = _weights(tmp_path / "plain"), _weights(tmp_path / "ac")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_activation_checkpointing_refuses_norms_with_running_statistics(tiny_cfg):
    cfg = tiny_cfg("norm=batchnorm", "trainer.activation_checkpointing=true")
    with pytest.raises(ConfigError, match=r"cannot be used with this norm: its blocks keep running statistics"):
        du.checkpoint_activations(build_model(cfg, 256))
