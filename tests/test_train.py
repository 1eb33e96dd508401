"""The foundation: config composition, the run directory contract, resume, divergence, sweeps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from normbench import cli
from normbench.cli import listing
from normbench.config import files
from normbench.run.metrics import read_jsonl
from normbench.runtime import throughput
from normbench.train import callbacks, checkpoint, trainer
from normbench.validation import validate

from conftest import TINY, compose, run_cli

RECORD_KEYS = {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "time_s"}
DIAG_KEYS = {
    "grad_norm_layer",
    "grad_norm_attn",
    "grad_norm_mlp",
    "var_resid",
    "rms_resid",
    "maxabs_resid",
    "massive_ratio_resid",
    "update_ratio_layer",
    "logit_maxabs",
}
SUMMARY_KEYS = {
    "status",
    "reason",
    "step",
    "tokens",
    "final_loss",
    "final_val_loss",
    "best_val_loss",
    "tokens_per_s",
    "wall_s",
    "eval_s",
    "ckpt_s",
    "diag_s",
    "spec",
    "n_params",
    "arch",
    "norm",
    "optim",
    "seed",
    "device",
    "precision",
}


@pytest.mark.parametrize("group,option", [(g, o) for g in files.GROUPS if g != "experiment" for o in files.options(g)])
def test_every_group_option_composes_and_validates(group, option):
    extra = {
        "files": ["data.paths=[x.txt]"],
        "hf": ["data.hf_path=some/dataset"],
        "shards": ["data.train=x_train_*.bin", "data.val=x_val_*.bin"],
        "mix": ["data.mix=[a:1,b:2]"],
        "batchnorm": ["norm.allow_leak=true"],  # refused without it (tests/test_scale_and_batch_norms.py)
    }.get(option, [])
    cfg = compose([f"{group}={option}", *extra])
    node = cfg[group]
    assert node.name == option
    validate(cfg)


@pytest.mark.parametrize("experiment", files.options("experiment"))
def test_every_experiment_composes(experiment):
    cfg = compose([f"experiment={experiment}"])
    assert cfg.model.name == "tiny"  # every ready ablation runs on CPU by default
    text = (files.config_dir() / "experiment" / f"{experiment}.yaml").read_text()
    assert "# Question:" in text and "# @package _global_" in text


CHECKPOINT_KEYS = {
    *("model", "optimizer", "scaler", "sampler_rng", "torch_rng", "cuda_rng", "rank_rng", "step", "tokens"),
    *("best_val", "last_val", "initial_loss", "spikes", "recent_losses", "spike_steps_unlogged", "skipped"),
    *("amp_skipped", "eval_missing", "wandb_id", "summary", "clock", "config"),
}


def test_list_prints_every_option_with_its_source(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for group in files.GROUPS:
        assert f"{group}:" in out
        for option in files.options(group):
            line = next(ln for ln in out.splitlines() if ln.strip().startswith(option + " "))
            assert len(line.split(None, 1)[1]) > 10, line  # a description, not just the name
    assert "arXiv:2410.01131" in out  # nGPT's paper
    assert max(len(ln) for ln in out.splitlines()) <= 180  # one short line per option
    assert "Adafactor (Shazeer & Stern 2018)" in out and "RELATIVE" not in out  # first sentence only
    for group in ("arch", "norm", "optim"):  # each with its paper (norm=none has none to cite)
        for option in set(files.options(group)) - {"none"}:
            assert listing._CITES.search(listing.describe(files.config_dir() / group / f"{option}.yaml")), (
                group,
                option,
            )
    assert cli.main(["list", "arch"]) == 0
    assert cli.main(["list", "bogus"]) == 2


def _run_in_process(run_dir: Path, *overrides: str) -> dict:
    return trainer.run(compose([*TINY, *overrides]), run_dir)


def test_run_dir_holds_every_file_and_key(tmp_path):
    proc = run_cli(
        ["train", "arch=post_ln", "norm=rmsnorm", "model=tiny", "trainer.max_steps=30", "hydra.run.dir=run"],
        cwd=tmp_path,
        check=True,
    )
    run = tmp_path / "run"
    for name in (
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        ".hydra/hydra.yaml",
        "metrics.jsonl",
        "summary.json",
        "train.log",
        "checkpoints/last.pt",
    ):
        assert (run / name).is_file(), name
    records = read_jsonl(run / "metrics.jsonl")
    assert records and all(RECORD_KEYS <= set(r) for r in records)
    assert [r["step"] for r in records] == sorted({r["step"] for r in records})
    evals = [r for r in records if "val_loss" in r]
    assert evals[0]["step"] == 1 and evals[-1]["step"] == 30
    diag = [r for r in records if "var_resid" in r]
    assert diag, "diag=default records diagnostics"
    assert DIAG_KEYS <= set(diag[0])
    assert len(diag[0]["var_resid"]) == 3 and len(diag[0]["grad_norm_layer"]) == 2
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["init_std"] == pytest.approx(0.02 * (768 / 64) ** 0.5)  # model=tiny's auto init, as drawn
    # the checkpoint format (docs/contract.md §3: train_state.TrainState's list) stays what older versions wrote
    assert set(torch.load(run / "checkpoints" / "last.pt", weights_only=True)) == CHECKPOINT_KEYS
    assert summary["status"] == "completed" and summary["step"] == 30
    assert summary["tokens"] == 30 * 16 * 64 == records[-1]["tokens"]
    assert summary["arch"] == "post_ln" and summary["norm"] == "rmsnorm"
    # the model learns: validation loss falls well below where it started
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    log = (run / "train.log").read_text()
    assert "params" in log and "step 30/30" in log and "ETA" in log
    assert "step 30/30" in proc.stdout  # progress on the console too


def test_same_seed_same_losses_to_the_bit(tmp_path):
    a = _run_in_process(tmp_path / "a", "trainer.max_steps=12", "seed=3")
    b = _run_in_process(tmp_path / "b", "trainer.max_steps=12", "seed=3")
    c = _run_in_process(tmp_path / "c", "trainer.max_steps=12", "seed=4")
    la = [r["loss"] for r in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    lb = [r["loss"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    lc = [r["loss"] for r in read_jsonl(tmp_path / "c" / "metrics.jsonl")]
    assert la == lb
    assert la != lc
    assert a["final_loss"] == b["final_loss"] != c["final_loss"]


def _interrupt_after(monkeypatch, run_dir: Path, steps: int, *overrides: str) -> None:
    """Run in-process and stop after ``steps`` optimizer steps the way a SIGTERM does."""
    original = trainer.Trainer.optimizer_step

    def stepping_then_stop(self, grad_norm):
        stepped = original(self, grad_norm)
        if self.step == steps - 1:  # the step counter moves on right after the optimizer step
            self.stop_signal = 15
        return stepped

    monkeypatch.setattr(trainer.Trainer, "optimizer_step", stepping_then_stop)
    with pytest.raises(trainer.Interrupted):
        _run_in_process(run_dir, *overrides)
    monkeypatch.setattr(trainer.Trainer, "optimizer_step", original)


def test_resume_equals_uninterrupted(tmp_path, monkeypatch):
    args = ("trainer.max_steps=20", "trainer.ckpt_every=100", "trainer.log_every=1", "arch=peri_ln")
    _run_in_process(tmp_path / "full", *args)

    _interrupt_after(monkeypatch, tmp_path / "cut", 8, *args)
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["step"] == 8
    _run_in_process(tmp_path / "cut", *args, "trainer.resume=true")

    full = read_jsonl(tmp_path / "full" / "metrics.jsonl")
    cut = read_jsonl(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in cut] == [r["step"] for r in full] == list(range(1, 21))
    assert [r["loss"] for r in cut] == [r["loss"] for r in full]
    assert [r.get("val_loss") for r in cut] == [r.get("val_loss") for r in full]
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "completed"


def test_divergence_is_recorded_and_exits_zero(tmp_path):
    proc = run_cli(
        [
            "train",
            *TINY,
            "optim=sgd",
            "optim.lr=1e4",
            "trainer.grad_clip=0",
            "trainer.max_steps=40",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert summary["reason"] and summary["step"] < 40


def test_max_tokens_stops_first(tmp_path):
    summary = _run_in_process(tmp_path / "r", "trainer.max_steps=100", "trainer.max_tokens=5000")
    assert summary["step"] == 5000 // (8 * 64)
    assert summary["tokens"] == summary["step"] * 8 * 64


def test_data_cache_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMBENCH_CACHE", str(tmp_path / "cache"))
    _run_in_process(tmp_path / "a", "trainer.max_steps=2", "data=synthetic")
    _run_in_process(tmp_path / "b", "trainer.max_steps=2", "data=synthetic")
    assert "tokenizing" in (tmp_path / "a" / "train.log").read_text()
    log_b = (tmp_path / "b" / "train.log").read_text()
    assert "tokenizing" not in log_b and "cached" in log_b


@pytest.mark.slow
def test_multirun_makes_one_dir_per_job(tmp_path):
    proc = run_cli(
        ["train", "-m", "arch=pre_ln,post_ln", "seed=0,1", "model=tiny", "trainer.max_steps=10"], cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    jobs = sorted(p for p in (tmp_path / "outputs" / "multirun").glob("*/*/*") if p.is_dir())
    assert len(jobs) == 4
    names = {p.name for p in jobs}
    assert "0_arch=pre_ln,model=tiny,seed=0,trainer.max_steps=10" in names
    for job in jobs:
        assert json.loads((job / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize(
    "override,needle",
    [
        ("arch=nonsense", "arch=nonsense is not an option; choose one of: deepnorm"),
        ("trainer.max_steps=abc", "trainer.max_steps"),
        ("model.n_head=5", "model.n_head=5 must divide model.d_model=64"),
        ("optim.lr=-1", "optim.lr=-1.0 must be >= 0"),
        ("trainer.max_step=3", "did you mean 'trainer.max_steps'"),
        ("optim.eps=-1", "optim.eps=-1.0 must be >= 0"),
        ("optim=sgd optim.momentum=-1", "optim.momentum=-1.0 must be in [0, 1)"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, override, needle):
    assert cli.main(["train", "model=tiny", *override.split(), f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("normbench: error:") and needle in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing started


def test_cfg_job_and_help_work(tmp_path):
    proc = run_cli(["train", "--cfg", "job", "arch=ngpt"], cwd=tmp_path, check=True)
    assert "name: ngpt" in proc.stdout
    proc = run_cli(["train", "--help"], cwd=tmp_path, check=True)
    arch_line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("arch: "))
    assert {"deepnorm", "hybridnorm", "simplenorm", "fixup"} <= {
        a.strip() for a in arch_line.split(":", 1)[1].split(",")
    }


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "normbench"
    if not exe.exists():
        exe = shutil.which("normbench")
    assert exe, "the normbench console script is installed with the package"


@pytest.mark.slow
def test_user_config_dir_overlays_conf(tmp_path):
    import yaml

    from normbench.config.schema import qk_norm_mode

    (tmp_path / "mine" / "arch").mkdir(parents=True)
    (tmp_path / "mine" / "arch" / "pre_qk.yaml").write_text(
        "# Pre-LN with QK-norm (a user overlay)\nname: pre_ln\nqk_norm: true\n"
    )
    args = ["train", "--config-dir", "mine", "model=tiny", "trainer.max_steps=3", "hydra.run.dir=r"]
    run_cli([*args, "arch=pre_qk"], cwd=tmp_path, check=True)
    saved = yaml.safe_load((tmp_path / "r" / ".hydra" / "config.yaml").read_text())
    assert qk_norm_mode(saved["arch"]["qk_norm"]) == "head"  # the overlay's old boolean form still reads
    proc = run_cli([*args, "arch=pre_qkz"], cwd=tmp_path)
    assert proc.returncode == 2 and "pre_qk" in proc.stderr.strip().splitlines()[-1]


def test_eval_follows_eval_every_whatever_log_every(tmp_path):
    _run_in_process(tmp_path / "r", "trainer.max_steps=60", "trainer.log_every=10", "trainer.eval_every=25", "diag=off")
    evals = [r["step"] for r in read_jsonl(tmp_path / "r" / "metrics.jsonl") if "val_loss" in r]
    assert evals == [1, 25, 50, 60]


def test_checkpoint_between_log_steps_carries_every_loss(tmp_path):
    """A periodic checkpoint taken between log steps must hold the loss bookkeeping up to its step."""

    _run_in_process(tmp_path / "r", "trainer.max_steps=12", "trainer.ckpt_every=5", "trainer.log_every=10")
    full = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    state = checkpoint.load(tmp_path / "r" / "checkpoints" / "last.pt")
    assert state["step"] == 12
    assert state["initial_loss"] == full[0]["loss"]  # the step-1 loss, checked before the step-5 checkpoint
    assert len(state["recent_losses"]) == 12


def test_wall_clock_and_throughput_continue_across_a_resume(tmp_path, monkeypatch):
    args = ("trainer.max_steps=16", "trainer.log_every=1", "diag=off")
    _interrupt_after(monkeypatch, tmp_path / "r", 8, *args)
    first = json.loads((tmp_path / "r" / "summary.json").read_text())
    final = _run_in_process(tmp_path / "r", *args, "trainer.resume=true")
    times = [r["time_s"] for r in read_jsonl(tmp_path / "r" / "metrics.jsonl")]
    assert times == sorted(times)  # time_s does not restart at 0 after the resume
    assert final["wall_s"] > first["wall_s"]


def test_list_into_a_closed_pipe_is_quiet(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "normbench", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    proc.stdout.close()  # like `| head` that left already: the child starts in ~1 s, then writes into a closed pipe
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err


def test_torchrun_worker_exit_flushes_output_and_keeps_the_exit_code(tmp_path):
    """A torchrun worker leaves through os._exit (gloo aborts in interpreter teardown): output and code survive."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # piped stdout is block-buffered
    env["WORLD_SIZE"] = "2"

    def run(*args):
        cmd = [sys.executable, "-m", "normbench", *args]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    listed = run("list", "arch")
    assert listed.returncode == 0 and "peri_ln" in listed.stdout
    bad = run("train", "arch=nonsense")
    assert bad.returncode == 2 and "arch" in bad.stderr and "pre_ln" in bad.stderr


def test_ranks_split_the_global_batch_of_one_process():
    """Batches: rank r of N reads micro-batches r, r+N, ...; together they are one process's global batch."""
    import numpy as np
    import torch

    from normbench.data.batches import Batches

    tokens = np.arange(1000, dtype=np.uint16)
    cpu = torch.device("cpu")
    whole = Batches(tokens, 3, 8, seed=7, device=cpu).global_step(4, rank=0, world=1)
    ranks = [Batches(tokens, 3, 8, seed=7, device=cpu).global_step(4, rank=r, world=2) for r in (0, 1)]
    assert [len(r) for r in ranks] == [2, 2]
    for micro, (x, y) in enumerate(whole):
        rx, ry = ranks[micro % 2][micro // 2]
        assert torch.equal(rx, x) and torch.equal(ry, y)
        assert torch.equal(y[:, :-1], x[:, 1:]) and x.shape == (3, 8)  # targets are inputs shifted by one
        assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(3, 7, dtype=torch.int64))  # contiguous windows
    assert not torch.equal(whole[0][0], whole[1][0])  # micro-batches differ


def test_eta_is_smoothed(monkeypatch):
    """Log windows alternate 1 s and 3 s per step (evals, diagnostics): the ETA moves by far less than x3."""
    clock = iter([0.0, 10.0, 40.0, 50.0, 80.0, 90.0, 120.0])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    eta = throughput.Eta()
    etas = [eta.remaining(step, 1000, 1.0) / (1000 - step) for step in range(0, 70, 10)]
    assert etas[1] == 1.0  # the first window's rate as it is
    later = etas[2:]
    assert max(later) / min(later) < 1.5 and 1.3 < later[-1] < 2.5  # between 1 and 3 s/step, steady


def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path):
    """NORMBENCH_PLUGINS (the hook point for code outside the package) names modules every command imports."""
    proc = run_cli(["list", "optim"], cwd=tmp_path, env={"NORMBENCH_PLUGINS": "normbench_test_hooks,no_such_plugin"})
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "NORMBENCH_PLUGINS: cannot import 'no_such_plugin'" in proc.stderr


def test_summary_says_where_the_wall_clock_went_besides_the_steps(tmp_path, monkeypatch):
    """eval_s, ckpt_s and diag_s (issue 51): a checkpoint write slowed by 0.2 s shows in ckpt_s, an evaluation
    slowed by 0.1 s per batch in eval_s; each is a part of wall_s."""
    save, evaluate = checkpoint.save_atomic, callbacks.Validate.evaluate

    def slow_save(state, path):
        time.sleep(0.2)
        save(state, path)

    def slow_evaluate(self):
        time.sleep(0.1)
        return evaluate(self)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_save)
    monkeypatch.setattr(callbacks.Validate, "evaluate", slow_evaluate)
    cfg = compose([*TINY, "trainer.max_steps=20", "trainer.ckpt_every=10", "trainer.eval_every=10"])
    s = trainer.run(cfg, tmp_path / "run")
    assert s["ckpt_s"] >= 0.2 * 2  # steps 10 and 20 (the last)
    assert s["eval_s"] >= 0.1 * 3  # steps 1, 10 and 20
    assert s["diag_s"] > 0  # diag.every=10: steps 1, 10, 20
    assert s["ckpt_s"] + s["eval_s"] + s["diag_s"] < s["wall_s"]
