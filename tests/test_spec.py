"""The run spec (config/spec.py): ``optim.lr=auto``, ``precision=auto`` and ``compile=auto`` resolved once, in
config/, and read from there."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from normbench.config import spec as spec_module
from normbench.config.spec import RunSpec, spec_of
from normbench.errors import ConfigError
from normbench.model import build_model
from normbench.model.kinds import param_kinds
from normbench.optim.optimizers import build_optimizer
from normbench.run.metrics import read_jsonl
from normbench.runtime import compiling, length, precision
from normbench.train import build, trainer
from normbench.train.build import resolve_device
from normbench.validation import prepare

from conftest import compose

SRC = Path(__file__).resolve().parents[1] / "src" / "normbench"
# the rule's functions; only config/ (the rule, the spec) and validation.py (its limits) may call them
RESOLVERS = re.compile(r"lr_rule\.(resolve|matrix_lr|source|flat_resolved)\b|\bresolve_lr\(|\brun_spec\(")
ALLOWED = {"config/lr_rule.py", "config/spec.py", "validation.py", "run/resume.py"}


def test_prepare_resolves_auto_once_into_a_frozen_spec():
    cfg, _ = prepare(compose(["model=tiny", "optim.lr=auto"]))
    assert cfg.spec == RunSpec(
        lr=7.2e-3,
        lr_source="optim.lr=auto (0.0006 x 768/64)",
        matrix_lr=7.2e-3,
        precision="fp32",  # precision=auto on CPU
        precision_source="precision=auto: fp32 on CPU",
        compile=False,  # compile=auto on CPU: eager, whatever the length
        compile_source=spec_module.resolve_compile(compose(["model=tiny"]), on_cuda=False, estimate=None)[1],
        length=cfg.spec.length,  # below, by hand
        kind_lrs=cfg.spec.kind_lrs,  # below
    )
    assert set(cfg.spec.kind_lrs.values()) == {7.2e-3} and {"matrix", "embed"} <= set(cfg.spec.kind_lrs)
    run_len = cfg.spec.length
    # 600 steps (trainer.max_steps), warmup null = 10% of them, GPT-2's 0.02 carried to d 64 at its gain
    assert (run_len.max_steps, run_len.warmup_steps) == (600, 60)
    assert run_len.init_std == pytest.approx(0.02 * (768 / 64) ** 0.5)
    with torch.device("meta"):  # N: the weight matrices of the model the config builds (256-byte vocabulary)
        model = build_model(cfg, 256)
    assert run_len.length_params == sum(
        p.numel() for name, p in model.named_parameters() if param_kinds(model)[name] in ("matrix", "embed", "head")
    )
    assert run_len.source.startswith("length: 600 steps x 1,024 tokens") and "from trainer.max_steps" in run_len.source
    assert cfg.optim.lr == "auto"  # the request stays as written (the run's config, its resume check)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.spec.lr = 1.0
    assert spec_of(cfg) is cfg.spec  # a prepared config's spec is read, not resolved again


def test_spec_under_mup_and_a_number_and_a_refused_auto():
    # muP: the scalar is the LR at d_base (64), the hidden matrices get d_base/d of it (1e-3 x 64/128 at d 128)
    spec = spec_of(compose(["model=tiny", "model.d_model=128", "model.param=mup", "optim.lr=1e-3"]))
    assert (spec.lr, spec.matrix_lr, spec.lr_source) == (1e-3, 5e-4, "optim.lr=0.001")
    with pytest.raises(ConfigError, match="optim.lr=auto .* optim=lion has no such rule"):
        prepare(compose(["model=tiny", "optim=lion", "optim.lr=auto"]))


def test_no_module_outside_config_and_validation_resolves_the_lr():
    """Readers take the number from the spec; the rule is called in config/ and validation.py only (and by
    run/resume.py on old runs' flat configs, which have no spec: the resume check compares numbers)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RESOLVERS.search(line) or re.search(r"""\.lr\s*==\s*["']auto["']|AUTO\b""", line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
    assert RESOLVERS.search("    lr = lr_rule.resolve(cfg.optim, cfg.model)")  # the pattern catches the old form


# ------------------------------------------------------------------ precision=auto, compile=auto (issue 51)
def test_the_defaults_are_auto_and_resolve_to_todays_cpu_run():
    """conf/config.yaml asks for the fast form (``train --cfg job`` shows ``auto``); on CPU it is today's: fp32,
    eager, even for a run long enough that the estimate would compile it."""
    cfg = compose(["model=tiny", "trainer.max_steps=10000000"])
    assert (cfg.precision, cfg.compile) == ("auto", "auto")
    spec = prepare(cfg)[0].spec
    assert (spec.precision, spec.compile) == ("fp32", False)


def gpu(monkeypatch, bf16: bool) -> None:
    """This machine as one CUDA GPU (with or without bf16) to the resolver; nothing runs on it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Old GPU")


def test_on_a_gpu_auto_is_bf16_and_compiles_a_run_that_repays_it(monkeypatch):
    gpu(monkeypatch, bf16=True)
    peak = "peak_flops=1e14"  # given: the estimate reads no device property
    long, _ = prepare(compose(["model=tiny", peak, "trainer.max_steps=10000000"]))
    assert (long.spec.precision, long.spec.compile) == ("bf16", True)
    assert long.spec.compile_source.startswith("compile=auto: 10000000 steps x ")
    assert precision.autocast_dtype(long) is torch.bfloat16  # readers take the resolved value
    short, _ = prepare(compose(["model=tiny", peak, "trainer.max_steps=10"]))
    assert short.spec.compile is False and short.spec.compile_source.endswith(": eager")
    pinned, _ = prepare(compose(["model=tiny", peak, "precision=fp32", "compile=false"]))
    assert (pinned.spec.precision, pinned.spec.compile) == ("fp32", False)  # as given: reproduce's pins
    gpu(monkeypatch, bf16=False)
    assert prepare(compose(["model=tiny", peak]))[0].spec.precision == "fp32"  # an old GPU: fp32 (with TF32)


def test_the_compile_estimate_is_the_reproduce_rule(monkeypatch):
    """The run's compile=auto on a GPU is runtime/compiling.decide, the rule reproduce pins claims with."""
    gpu(monkeypatch, bf16=True)
    cfg = prepare(compose(["model=tiny", "peak_flops=1e14", "trainer.max_steps=300000"]))[0]
    assert compiling.estimate_for_run(cfg) == (cfg.spec.compile, cfg.spec.compile_source)
    assert spec_module.resolve_compile(cfg, on_cuda=False, estimate=None)[0] is False


def test_a_precision_the_device_lacks_is_one_line(monkeypatch):
    with pytest.raises(ConfigError, match=r"^precision=fp16 needs a CUDA GPU \(GradScaler\); on CPU use precision"):
        resolve_device(prepare(compose(["model=tiny", "device=cpu", "precision=fp16"]))[0])
    gpu(monkeypatch, bf16=False)
    with pytest.raises(ConfigError, match=r"^precision=bf16: this GPU \(Old GPU\) has no bf16 arithmetic; use "):
        precision.check_device("bf16", torch.device("cuda", 0))
    precision.check_device("bf16", torch.device("cpu"))  # bf16 on CPU: allowed (the claims' CPU mode)


def test_no_module_reads_the_precision_request_but_the_resolver():
    """``cfg.precision`` is a request (auto); readers take ``spec_of(cfg).precision``. Read as written only by the
    resolver, the validation of its name and the sweep's pre-check of what this machine cannot run."""
    allowed = {"config/spec.py", "validation.py", "cli/overrides.py"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if rel not in allowed and re.search(r"\bcfg\.precision\b", line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_runs_of_the_old_defaults_resume_and_keep_their_store_address():
    """Runs made when the defaults were fp32 and eager: on CPU, ``auto`` resolves to them, so such a run resumes
    under the new defaults and reproduce's store serves it to the same job (run/resume.py, reproduce/store.py)."""
    from normbench.reproduce.store import address
    from normbench.run.resume import config_diff

    assert config_diff({"precision": "fp32", "device": "auto"}, {"precision": "auto", "device": "auto"}) == []
    assert config_diff({"precision": "bf16"}, {"precision": "auto"}) == ["precision"]  # auto is fp32 here
    old = compose(["model=tiny", "precision=fp32", "compile=false"])
    assert address(compose(["model=tiny"]), 0) == address(old, 0)


# ------------------------------------------------------------- the length, warmup and init std (issue 54)
def test_the_length_is_resolved_once_and_the_run_trains_it(tmp_path):
    """tokens_per_param gives the steps in the spec; the run trains exactly them, with the spec's warmup in its
    LR schedule, and records the spec (summary.json) with its length."""
    overrides = ["model=tiny", "trainer.tokens_per_param=0.5", "sched.warmup_steps=null", "diag=off"]
    cfg, _ = prepare(compose([*overrides, "trainer.batch_size=4"]))
    run_len = cfg.spec.length
    assert run_len.max_steps == round(0.5 * run_len.length_params / (4 * 64))  # R x N / tokens per step
    assert run_len.warmup_steps == int(0.1 * run_len.max_steps) > 0
    summary = trainer.run(compose([*overrides, "trainer.batch_size=4", "trainer.log_every=1"]), tmp_path)
    assert summary["max_steps"] == run_len.max_steps
    assert summary["spec"]["length"]["max_steps"] == run_len.max_steps
    records = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "lr" in r]
    assert records[-1]["step"] == run_len.max_steps
    lrs = [r["lr"] for r in records]
    peak = cfg.spec.lr
    assert lrs[0] == pytest.approx(peak / run_len.warmup_steps)  # step 0 of the warmup: 1/warmup of the peak
    assert lrs[run_len.warmup_steps - 1] == pytest.approx(peak)  # its last step reaches the peak


def test_a_model_smaller_than_the_config_says_decides_its_own_length(caplog):
    """A data vocabulary that differs from the config's (a BPE trained to fewer tokens than data.vocab_size):
    the build counts the model it trains, re-resolves the length by the same rule and says so."""
    cfg, _ = prepare(compose(["model=tiny", "trainer.tokens_per_param=1"]))
    real = build_model(cfg, 128)  # as if the data had 128 tokens, not 256
    with caplog.at_level("INFO", logger="normbench"):
        planned = cfg.spec.length
        run_len = build.checked_length(cfg, real)
    n = sum(p.numel() for name, p in real.named_parameters() if param_kinds(real)[name] in ("matrix", "embed", "head"))
    assert run_len.length_params == n < planned.length_params
    assert cfg.spec.length == run_len and run_len.max_steps == round(n / length.tokens_per_step(cfg))
    assert "the data's vocabulary gives" in caplog.text


def test_the_attention_mode_is_in_the_spec():
    """attn_fp32 keeps the attention kernel out of an autocast: true in the spec only where there is one."""
    assert spec_of(compose(["model=tiny", "precision=bf16", "attn_fp32=true"])).attn_fp32 is True
    assert spec_of(compose(["model=tiny", "precision=fp32", "attn_fp32=true"])).attn_fp32 is False  # no autocast
    assert spec_of(compose(["model=tiny", "precision=bf16", "attn_fp32=false"])).attn_fp32 is False
    assert precision.precision_name(compose(["model=tiny", "precision=bf16", "attn_fp32=true"])) == (
        "bf16, attention fp32"
    )


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim=adamw"],
        ["optim=adamw", "model.d_model=128", "model.n_head=8", "model.param=mup"],  # muP's per-kind multipliers
        ["optim=muon", "optim.lr=0.05"],  # Muon's matrices beside AdamW's vectors
    ],
)
def test_the_kinds_lrs_in_the_spec_are_the_optimizers(overrides):
    """The peak LR of each kind of parameter is resolved at prepare (over the model on the meta device) and equals
    what the optimizer built over the real model has in its groups."""
    cfg, _ = prepare(compose(["model=tiny", *overrides]))
    built = build_optimizer(build_model(cfg, 256), cfg, log=lambda _line: None)
    assert cfg.spec.kind_lrs == built.kind_lrs and len(cfg.spec.kind_lrs) >= 3
