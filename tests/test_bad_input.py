"""Bad input: each is one line on stderr naming the key and what is allowed, a non-zero exit, no traceback,
and no training. Most cases run ``cli.main`` in-process (fast); a few go through a real subprocess."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from normbench import cli
from normbench.run.metrics import read_jsonl

from conftest import run_cli

BASE = ["model=tiny", "trainer.batch_size=2", "trainer.max_steps=2", "trainer.eval_batches=1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    # 38 documents; the hash rule holds out two (46 byte tokens with their end-of-text ids)
    (d / "small.jsonl").write_text("".join(json.dumps({"text": f"hello, small file {i}.\n"}) + "\n" for i in range(38)))
    (d / "empty.txt").write_text("")
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50)
    return d


def train(capsys, *args: str) -> tuple[int, str]:
    """``python -m normbench train ARGS`` in-process: (exit code, stderr)."""
    capsys.readouterr()
    try:
        code = cli.main(["train", *args])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_one_line_error(code, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("normbench: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


CASES = [
    # (overrides, what the line must say); {d} is the directory of the data files above
    (["arch=foo"], ["arch=foo is not an option; choose one of: deepnorm", "pre_ln"]),
    (["norm=groupnorm"], ["norm=groupnorm is not an option", "rmsnorm"]),
    (["optim=adam"], ["optim=adam is not an option", "adamw"]),
    (["sched=linear"], ["sched=linear is not an option", "cosine"]),
    (["data=web"], ["data=web is not an option", "kjv"]),
    (["model=huge"], ["model=huge is not an option", "tiny"]),
    (["logger=tensorboard"], ["logger=tensorboard is not an option", "wandb"]),
    (["diag=some"], ["diag=some is not an option", "full"]),
    (["experiment=nope"], ["experiment=nope is not an option", "placement"]),
    (["hydra/launcher=nope"], ["hydra/launcher=nope is not an option", "joblib"]),
    (["norm=rmsnrom"], ["norm=rmsnrom is not an option (did you mean rmsnorm?); choose one of:"]),
    (["hydra/launcher=jobib"], ["hydra/launcher=jobib is not an option (did you mean joblib?)"]),
    (["optim.lr=abc"], ["optim.lr=abc is not allowed; choose auto or a number >= 0"]),  # auto: the carried LR
    (["trainer.max_steps=1.5"], ["trainer.max_steps=1.5 is not a whole number", "(e.g. trainer.max_steps=600)"]),
    # a comma list without -m is a sweep: one line saying so (Hydra's own text was 5 lines, exit 1)
    # a config group takes one option, so -m is the fix (no list value); a plain key may take a list
    (
        ["model=tiny,small"],
        [
            "model=tiny,small is a sweep (one job per value): add -m (python -m normbench "
            "train -m model=tiny,small ...); model is a config group, so a single run takes one "
            "of its options"
        ],
    ),
    # what only Hydra finds (a launcher key without that launcher, a missing primary config): one line too
    (["hydra.launcher.n_jobs=2"], ["Could not override 'hydra.launcher.n_jobs'", "(from Hydra, before any job"]),
    (["trainer.resume=maybe"], ["trainer.resume", "bool"]),
    (["optim.lr=-1"], ["optim.lr=-1.0 must be >= 0"]),  # lr 0 is allowed: a no-training control
    (["optim.lr=nan"], ["optim.lr=nan is not a number"]),
    (["trainer.batch_size=0"], ["trainer.batch_size=0 must be > 0"]),
    (["trainer.batch_size=-4"], ["trainer.batch_size=-4 must be > 0"]),
    (["trainer.max_steps=0"], ["trainer.max_steps=0 must be > 0"]),
    (["trainer.max_steps=-3"], ["trainer.max_steps=-3 must be > 0"]),
    (["trainer.max_steps=10", "sched.warmup_steps=10"], ["sched.warmup_steps=10 must be shorter", "max_steps=10"]),
    (
        ["trainer.max_steps=100", "trainer.max_tokens=2048", "sched.warmup_steps=50"],
        ["sched.warmup_steps=50 must be shorter", "trainer.max_tokens=2048 gives"],
    ),
    (["+trainer.max_step=1"], ["unknown config key 'trainer.max_step'", "did you mean 'trainer.max_steps'"]),
    (["logger=wandb", "logger.wandb.mode=bogus"], ["logger.wandb.mode='bogus' is not allowed", "offline"]),
    (["logger.name=tensorboard"], ["logger.name='tensorboard' is not allowed", "jsonl, wandb"]),
    (["model.rope_theta=0"], ["model.rope_theta=0.0 must be > 0"]),
    (["arch=mix_ln", "arch.final_norm=false"], ["arch.final_norm=false", "allowed: true"]),
    (["model.n_head=5"], ["model.n_head=5 must divide model.d_model=64", "allowed n_head: 1, 2, 4, 8"]),
    (["model.n_layer=0"], ["model.n_layer=0 must be > 0"]),
    (["arch=mix_ln", "arch.post_ratio=1.5"], ["arch.post_ratio=1.5 must be in [0, 1]"]),
    (["arch=mix_ln", "arch.post_ratio=-0.1"], ["arch.post_ratio=-0.1 must be in [0, 1]"]),
    (["arch=deepnorm", "arch.alpha=0"], ["arch.alpha=0.0 must be > 0"]),
    (["arch=deepnorm", "arch.alpha=-2"], ["arch.alpha=-2.0 must be > 0"]),
    (["device=cpu", "precision=fp16"], ["precision=fp16 needs a CUDA GPU", "fp32 or bf16"]),
    (["trainer.max_step=3"], ["unknown config key 'trainer.max_step'", "did you mean 'trainer.max_steps'"]),
    (["optim.lrr=1e-3"], ["unknown config key 'optim.lrr'", "did you mean 'optim.lr'"]),
    (["sed=1"], ["unknown config key 'sed'", "did you mean 'seed'"]),
    (["optimizer=adamw"], ["unknown config key 'optimizer'", "did you mean 'optim'"]),
    (["arch"], ["cannot parse 'arch'", "key=value"]),
    # Hydra's own grammar, hydra.* overrides included: one line with the quoting that works
    (["hydra.run.dir=runs/é"], ["cannot parse the override hydra.run.dir=runs/é", "\"hydra.run.dir='runs/é'\""]),
    (["data=files", "data.paths=[données.txt]"], ["data.paths=[données.txt]", "\"data.paths='[données.txt]'\""]),
    (["trainer.max_steps=${oc.env:NORMBENCH_UNSET_VAR}"], ["trainer.max_steps", "NORMBENCH_UNSET_VAR"]),
    # found only once the data is read (inside the job, still before the first step)
    (["data=files", "data.paths=[{d}/small.jsonl]"], ["model.seq_len=64 is longer than the validation split"]),
    (["data=files", "data.paths=[{d}/missing.txt]"], ["data.paths", "missing.txt", "not found"]),
    (["data=files", "data.paths=[{d}/empty.txt]"], ["data.paths", "empty.txt", "holds no documents"]),
    (["data=files", "data.paths=[{d}/latin1.txt]"], ["data.paths", "latin1.txt", "not UTF-8"]),
    (["data=hf", "data.hf_path=some/name"], ["data.hf_path='some/name'", "needs the network", "or a local path"]),
]
if not torch.cuda.is_available():
    CASES.append((["device=cuda"], ["device=cuda but no CUDA GPU", "device=cpu or device=auto"]))


def test_a_sweep_without_m_suggests_a_list_only_for_a_plain_key():
    from normbench.cli.overrides import sweep_without_m

    group = sweep_without_m("Ambiguous value for argument 'norm=layernorm,rmsnorm'")
    assert "add -m" in group and "[" not in group and "norm is a config group" in group
    plain = sweep_without_m("Ambiguous value for argument 'trainer.save_at=10,20'")
    assert "add -m" in plain and "write trainer.save_at=[10,20]" in plain
    assert sweep_without_m("some other message") is None


@pytest.mark.parametrize("overrides,needles", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_and_no_training(tmp_path, capsys, files, monkeypatch, overrides, needles):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    run = tmp_path / "run"
    overrides = [o.replace("{d}", str(files)) for o in overrides]
    code, err = train(capsys, *BASE, *overrides, f"hydra.run.dir={run}")
    assert_one_line_error(code, err, *needles)
    assert not read_jsonl(run / "metrics.jsonl"), "no step was trained"
    assert not (run / "checkpoints").exists()


def test_a_config_hydra_cannot_find_is_one_line(capsys, tmp_path):
    code, err = train(capsys, "--config-name", "nope", *BASE, f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "Cannot find primary config 'nope'", "(from Hydra, before any job started)")


@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["trainer.max_step=3"], ["did you mean 'trainer.max_steps'"]),
        (["model=tiny,small"], ["is a sweep (one job per value): add -m"]),
        (["hydra.launcher.n_jobs=2"], ["Could not override 'hydra.launcher.n_jobs'"]),
        (["data=files", "data.paths=[{d}/latin1.txt]"], ["not UTF-8"]),
        (["data=hf", "data.hf_path=some/name"], ["needs the network"]),
    ],
    ids=["unknown key", "comma list without -m", "Hydra-level error", "non-UTF-8 file", "hub dataset offline"],
)
def test_bad_input_in_a_real_process(tmp_path, files, overrides, needles):
    overrides = [o.replace("{d}", str(files)) for o in overrides]
    proc = run_cli(["train", *BASE, *overrides, "hydra.run.dir=run"], cwd=tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, *needles)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_wandb_online_without_credentials_falls_back_to_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        HOME=str(tmp_path / "home"),  # no ~/.netrc with W&B credentials
        NETRC=str(tmp_path / "no-netrc"),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_BASE_URL="http://127.0.0.1:9",  # nothing listens there: any network attempt would fail
        WANDB_SILENT="true",
    )
    # not run_cli: it sets WANDB_MODE=offline, and this run must start out "online"
    proc = subprocess.run(
        [sys.executable, "-m", "normbench", "train", *BASE, "logger=wandb", "hydra.run.dir=run2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no W&B credentials" in proc.stdout + proc.stderr and "logging offline" in proc.stdout + proc.stderr
    assert list((tmp_path / "run2" / "wandb").glob("offline-run-*"))
    assert read_jsonl(tmp_path / "run2" / "metrics.jsonl")[-1]["step"] == 2


# ------------------------------------------------------------------------------------------- property-based
CHOICES = {
    "arch": ["pre_ln", "post_ln", "peri_ln", "mix_ln", "deepnorm", "ngpt", "hybridnorm", "bogus"],
    "norm": ["layernorm", "rmsnorm", "dyt", "derf", "none", "batchnorm"],
    "optim": ["adamw", "sgd", "lion", "muon", "adafactor", "adam"],
    "sched": ["cosine", "wsd", "constant", "step"],
    "optim.lr": ["1e-3", "3e-2", "1e2", "0", "-1", "nan", "inf", "abc"],
    "optim.weight_decay": ["0", "0.1", "-0.1"],
    "model.n_layer": ["1", "2", "0", "-1"],
    "model.n_head": ["1", "2", "3", "4", "0"],
    "model.d_model": ["32", "48", "64", "0"],
    "model.seq_len": ["16", "32", "0"],
    "model.pos": ["rope", "learned", "alibi"],
    "model.mlp": ["swiglu", "gelu", "relu", "tanh"],
    "model.dropout": ["0.0", "0.1", "1.0"],
    "trainer.batch_size": ["1", "2", "0", "-2", "x"],
    "trainer.grad_accum": ["1", "2", "0"],
    "trainer.max_steps": ["1", "3", "0", "2.5"],
    "trainer.grad_clip": ["0", "1.0", "-1"],
    "trainer.skip_nonfinite": ["true", "false", "perhaps"],
    "sched.warmup_steps": ["0", "1", "2", "50", "-1"],
    "arch.post_ratio": ["0", "0.5", "1", "1.5", "-0.5"],
    "norm.eps": ["1e-5", "0", "-1e-6"],
    "precision": ["fp32", "bf16", "fp16", "fp8"],
    "device": ["cpu", "auto", "tpu"],
    "data.tokenizer": ["byte", "unicode"],
    "diag": ["off", "default", "full"],
    "trainer.max_stepz": ["3"],
    "seed": ["0", "7", "-1", "abc"],
}
overrides_strategy = st.lists(st.sampled_from(sorted(CHOICES)), unique=True, min_size=1, max_size=5).flatmap(
    lambda keys: st.tuples(*[st.sampled_from(CHOICES[k]).map(lambda v, k=k: f"{k}={v}") for k in keys])
)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overrides=overrides_strategy)
def test_random_overrides_give_a_result_or_one_line(capsys, overrides):
    """Any overrides: a finished run (completed or diverged, exit 0) or a one-line error (exit 2)."""
    run = Path(tempfile.mkdtemp(prefix="nb-prop-"))
    try:
        code, err = train(capsys, *BASE, "diag.every=1", *overrides, f"hydra.run.dir={run}")
        if code == 0:
            summary = json.loads((run / "summary.json").read_text())
            assert summary["status"] in ("completed", "diverged"), summary
        else:
            assert_one_line_error(code, err)
    finally:
        shutil.rmtree(run, ignore_errors=True)
        logger = logging.getLogger("normbench")
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()


@pytest.mark.parametrize("case", ["a file in the way", "no such place", "read-only"])
def test_unwritable_output_dir_is_one_line(tmp_path, capsys, monkeypatch, case):
    """Hydra creates the run directory before the job: an unwritable one used to be its traceback."""
    monkeypatch.chdir(tmp_path)
    if case == "a file in the way":
        (tmp_path / "outputs").write_text("not a directory")  # the default run dir is outputs/runs/...
        code, err = train(capsys, *BASE)
        assert_one_line_error(code, err, "cannot write the run directory outputs (a file is in the way)")
    elif case == "no such place":
        code, err = train(capsys, *BASE, "hydra.run.dir=/proc/normbench/run")
        assert_one_line_error(code, err, "cannot write the run directory /proc/normbench/run", "hydra.run.dir=DIR")
        code, err = train(capsys, "-m", *BASE, "seed=0,1", "hydra.sweep.dir=/proc/normbench/sweep")
        assert_one_line_error(code, err, "cannot write the sweep directory /proc/normbench/sweep", "hydra.sweep.dir=")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        (tmp_path / "ro").mkdir(mode=0o555)
        code, err = train(capsys, *BASE, "hydra.run.dir=ro/run")
        assert_one_line_error(code, err, "cannot write the run directory ro/run (Permission denied)")


def test_cfg_job_validates_the_config(capsys):
    code, err = train(capsys, "--cfg", "job", *BASE, "model.n_head=5")
    assert_one_line_error(code, err, "model.n_head=5 must divide model.d_model=64")
    from hydra.core.hydra_config import HydraConfig

    capsys.readouterr()
    try:
        assert cli.main(["train", "--cfg", "job", *BASE, "model.n_head=4"]) == 0
    finally:
        HydraConfig.instance().cfg = None  # Hydra's --cfg leaves its config set: relative paths would follow it
    assert "n_head: 4" in capsys.readouterr().out  # a valid config is printed as before
