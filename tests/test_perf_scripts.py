"""The performance scripts' CPU-side logic: bench_throughput.py's archs/compile suites (isolated
runs, FLOP/s and peak-memory ratios) and gpu_check.sh's plan (dry run) and table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from normbench.runtime.precision import cpu_native_bf16
from normbench.validation import ARCHS

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def bench(args: list[str], cwd: Path, timeout: float = 600) -> str:
    cmd = [sys.executable, str(SCRIPTS / "bench_throughput.py"), "--model", "tiny", "--repeats", "1", *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def table_rows(out: str, ncols: int) -> dict[str, list[str]]:
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == ncols and cells[0] in ARCHS:
            rows[cells[0]] = cells
    return rows


def num(cell: str) -> float:
    return float(re.sub(r"[^\d.]", "", cell))


@pytest.mark.slow  # three training processes (two tiny runs, nGPT's re-normalization share on model=small)
def test_bench_archs_suite_reports_flops_and_memory_relative_to_pre_ln(tmp_path):
    out = bench(["--suite", "archs", "--archs", "pre_ln,ngpt", "--steps", "7", "--threads", "1"], tmp_path)
    rows = table_rows(out, 10)
    assert set(rows) == {"pre_ln", "ngpt"}, out
    pre, ngpt = rows["pre_ln"], rows["ngpt"]
    # columns: arch, params, FLOPs/token, tokens/s, tokens/s ratio, FLOP/s ratio, MFU, peak mem, mem ratio, mem/est
    assert pre[4] == pre[5] == "1.000" and pre[8] == "1.00"
    assert pre[6] == "n/a"  # no MFU on CPU
    # FLOP/s ratio = tokens/s ratio x FLOPs-per-token ratio (nGPT's 4d SwiGLU does more per token)
    flops_ratio = num(ngpt[2]) / num(pre[2])
    assert flops_ratio > 1.1
    assert num(ngpt[5]) == pytest.approx(num(ngpt[4]) * flops_ratio, rel=0.02)
    for row in rows.values():  # a peak RSS growth of the run itself (MB), and its ratio to the estimate
        assert num(row[7]) > 0 and 0.05 < num(row[9]) < 20
    assert "nGPT weight re-normalization" in out


@pytest.mark.slow
def test_bench_set_overrides_every_run_and_is_refused_for_the_baseline(tmp_path):
    args = ["--suite", "archs", "--archs", "pre_ln", "--steps", "7", "--threads", "1"]
    narrow = bench([*args, "--set", "model.d_model=32", "--set", "model.n_head=2"], tmp_path)
    assert "# every run with: model.d_model=32 model.n_head=2" in narrow
    wide = bench(args, tmp_path)
    # half the width: fewer parameters and fewer FLOPs per token than tiny's d_model=64
    assert num(table_rows(narrow, 10)["pre_ln"][1]) < num(table_rows(wide, 10)["pre_ln"][1])
    assert num(table_rows(narrow, 10)["pre_ln"][2]) < num(table_rows(wide, 10)["pre_ln"][2])
    cmd = [sys.executable, str(SCRIPTS / "bench_throughput.py")]
    proc = subprocess.run([*cmd, "--suite", "baseline", "--set", "model.d_model=32"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--set does not apply to the baseline suite" in proc.stderr
    proc = subprocess.run([*cmd, "--suite", "archs", "--steps", "5"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--steps 5: a run's first 5 steps are untimed" in proc.stderr


@pytest.mark.slow
def test_bench_paired_suite_alternates_each_arch_with_pre_ln_in_one_process(tmp_path):
    out = bench(["--suite", "paired", "--archs", "pre_ln,ngpt,rezero", "--rounds", "3", "--threads", "1"], tmp_path)
    assert "2 steps each" in out
    rows = table_rows(out, 6)
    assert set(rows) == {"ngpt", "rezero"}, out  # pre_ln is the reference of every pair, not a row
    ngpt = rows["ngpt"]
    low, high = (float(v) for v in ngpt[4].split("-"))
    assert low <= float(ngpt[3]) <= high  # the median ratio lies between its quartiles
    # FLOP/s ratio = tokens/s ratio x FLOPs per token over pre_ln's (tiny: 0.84M)
    assert float(ngpt[5]) == pytest.approx(float(ngpt[3]) * num(ngpt[1]) / num(rows["rezero"][1]), rel=0.03)


@pytest.mark.slow
def test_bench_compile_suite_reports_speedup_and_compile_time(tmp_path):
    out = bench(["--suite", "compile", "--archs", "pre_ln", "--steps", "8"], tmp_path, timeout=900)
    rows = table_rows(out, 9)
    assert set(rows) == {"pre_ln"}, out
    row = rows["pre_ln"]
    assert num(row[1]) > 0 and num(row[2]) > 0 and row[3].endswith("x")
    cold, warm = (num(t) for t in row[5].split("/"))
    assert cold > 1  # seconds of compiling (inductor, cold cache): more than a second on any CPU
    assert warm < 0.8 * cold  # the second run finds the first one's FX-graph and AOTAutograd caches
    assert len(row[6].split("/")) == 2 and row[7] == "1.000"


MINIATURE_LAST = re.compile(r"^miniature: claims' mode (\d+\.\d\d)x eager fp32 \(tiny, 4 blocks\)$")


def miniature_rows(out: str) -> dict[str, list[str]]:
    lines = [line.strip().strip("|").split("|") for line in out.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in lines if len(cells) == 4}


@pytest.mark.slow
def test_bench_miniature_suite_measures_a_mode_against_eager_fp32_and_ends_with_the_ratio(tmp_path):
    # --set reaches the claim's jobs after the claims' mode (which follows the CPU): eager bf16 with fp32 attention
    # on any CPU, no compile to wait for
    sets = ["precision=bf16", "attn_fp32=true", "compile=false"]
    args = ["--suite", "miniature", "--rounds", "2", "--threads", "1", *(x for s in sets for x in ("--set", s))]
    out = bench(args, tmp_path)
    assert "the claims' mode (eager bf16, attention fp32; compile=false)" in out, out
    rows = miniature_rows(out)
    assert set(rows) == {"eager fp32", "eager bf16, attention fp32"}, out
    assert rows["eager fp32"][3] == "1.000 [1.000, 1.000]"  # the reference of every round
    last = out.strip().splitlines()[-1]
    assert re.search(r"\d+\.\d\dx", last) and (m := MINIATURE_LAST.match(last)), last
    median = float(rows["eager bf16, attention fp32"][3].split()[0])  # the table's median, at 3 places
    assert abs(float(m.group(1)) - median) <= 0.0051  # the last line's, at 2 (0.185 in the table may end 0.19)
    assert re.search(r"load average \d+\.\d\d / ", out)  # the load it was measured under
    # a claims' mode of eager fp32 is eager fp32: nothing to measure, the line still ends the output
    out = bench([*args, "--set", "precision=fp32"], tmp_path)
    assert MINIATURE_LAST.match(out.strip().splitlines()[-1]).group(1) == "1.00", out


def test_bench_miniature_reads_the_claims_mode_from_reproduce():
    sys.path.insert(0, str(SCRIPTS))
    from bench.miniature import claims_job

    cfg, reason = claims_job()  # rmsnorm_parity's baseline job at scale cpu, in the claims' mode (registry.cpu_mode)
    native = cpu_native_bf16()  # the mode follows the CPU: bf16 with fp32 attention where bf16 is native, else fp32
    assert (cfg.model.name, cfg.model.n_layer, cfg.norm.name) == ("tiny", 4, "layernorm")
    assert (cfg.precision, cfg.attn_fp32) == (("bf16", True) if native else ("fp32", False))
    assert cfg.compile is True and reason.startswith("compile=auto: ") and reason.endswith("compiling")
    assert cfg.trainer.max_steps == 4480  # 20 tokens per parameter, pinned as reproduce pins it
    cfg, reason = claims_job(["compile=false"])
    assert cfg.compile is False and reason == "compile=false"


@pytest.mark.slow  # compiles tiny (seconds with a warm inductor cache, ~50 s cold)
def test_bench_miniature_suite_times_the_compiled_claims_mode(tmp_path):
    out = bench(["--suite", "miniature", "--rounds", "2", "--threads", "1"], tmp_path, timeout=900)
    claims = "compiled bf16, attention fp32" if cpu_native_bf16() else "compiled fp32"  # the mode this CPU runs fast
    assert set(miniature_rows(out)) == {"eager fp32", claims}, out
    assert MINIATURE_LAST.match(out.strip().splitlines()[-1]), out


@pytest.mark.slow  # six forms of tiny, three of them compiled
def test_bench_forms_suite_pairs_every_form_with_eager_fp32(tmp_path):
    out = bench(["--suite", "forms", "--shapes", "tiny4", "--rounds", "2", "--threads", "1"], tmp_path, timeout=900)
    lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines()]
    peaks = {c[0]: c for c in lines if len(c) == 4 and " @ " in c[0]}
    assert "1024x1024 @ 1024x1024" in peaks and all(num(c[1]) > 0 and num(c[2]) > 0 for c in peaks.values())
    forms = {c[1]: c for c in lines if len(c) == 7 and c[0] == "tiny, 4 blocks"}
    assert set(forms) == {
        "eager fp32",
        "compiled fp32",
        "compiled bf16",
        "eager bf16",
        "compiled bf16, fp32 attention",
        "eager bf16, fp32 attention",
    }, out
    assert forms["eager fp32"][3] == "1.00 [1.00, 1.00]"
    f32_peak = num(peaks["1024x1024 @ 1024x1024"][1])
    for c in forms.values():  # GFLOP/s as a share of the fat product's fp32 rate
        assert num(c[5]) == pytest.approx(100 * num(c[4]) / f32_peak, abs=1.5)
    assert re.search(r"vmap: 3 seeds as one stacked model .*: \d+\.\d\dx \[", out), out
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_throughput.py"), "--suite", "forms", "--shapes", "tiny4,huge"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "unknown --shapes huge; choose from tiny4, tiny8, d128, d256" in proc.stderr


# --------------------------------------------------------------------------- gpu_check.sh
def gpu_check(env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, "NO_INSTALL": "1", **env}
    return subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh")], env=full, capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.mark.slow
def test_gpu_check_dry_run_plans_every_arch_and_a_ddp_smoke_run():
    proc = gpu_check({"DRY_RUN": "1", "DRY_RUN_GPUS": "2", "OUT": "/nonexistent/gpu_check"})
    assert proc.returncode == 0, proc.stderr
    planned = dict(re.findall(r"^gpu_check: \[(\w+)\] would run: (.*)$", proc.stdout, re.M))
    # the registry's archs (later ones too), and the checkpoint-cost measurement (issue 51)
    assert set(planned) == {*ARCHS, "pre_ln_eager", "ddp_smoke", "claim_smoke", "ckpt_cost"}
    assert planned["ckpt_cost"].split()[1:] == ["scripts/gpu_ckpt_check.py", "--out", "/nonexistent/gpu_check"]
    # the reference, its eager twin and the claim first: they fit the budget whatever the archs that follow
    assert list(planned)[:3] == ["pre_ln", "pre_ln_eager", "claim_smoke"]
    claim = planned["claim_smoke"].split()
    assert claim[claim.index("reproduce") + 1 :][:3] == ["rmsnorm_parity", "scale=gpu", "seeds=1"]
    assert "trainer.max_steps=100" in claim and "out=/nonexistent/gpu_check/claims" in claim
    for arch in ARCHS:  # pre_ln compiled, the sweep eager (issue 44: compiling every arch does not fit the budget)
        cmd = planned[arch].split()
        mode = "compile=true" if arch == "pre_ln" else "compile=false"
        assert {f"arch={arch}", "model=gpt2_124m", "precision=bf16", mode, "device=cuda"} <= set(cmd)
    assert "compile=false" in planned["pre_ln_eager"].split()
    assert "--nproc_per_node=2" in planned["ddp_smoke"] and "parallel=ddp" in planned["ddp_smoke"]
    assert f"{len(ARCHS) + 2} run configs compose and pass the config checks" in proc.stdout
    # the budget plan with the defaults on an H200: every run, pre_ln's steps 50 x (64 Ki tokens x its FLOPs per
    # token / 40% of 989 TFLOP/s), i.e. 0.1-0.2 s each, after 20 s of start-up (the final checkpoint's write
    # included) and 60 s of compiling
    rows = budget_rows(proc.stdout)
    assert set(rows) == {*ARCHS, "pre_ln_eager", "claim rmsnorm_parity", "ddp_smoke"} and rows["pre_ln"][2] == "fits"
    assert 20 + 60 + 50 * 0.1 < rows["pre_ln"][0] < 20 + 60 + 50 * 0.2
    assert "BUDGET_S=480 s on H200 (989 TFLOP/s bf16" in proc.stdout
    one = gpu_check({"DRY_RUN": "1", "DRY_RUN_GPUS": "1", "ARCHS": "ngpt", "CLAIM": "none"})
    assert one.returncode == 0 and "no DDP smoke run" in one.stdout and "ddp_smoke" not in one.stdout
    assert "claim_smoke" not in one.stdout
    bad = gpu_check({"DRY_RUN": "1", "ARCHS": "ngpt", "CLAIM": "none", "EXTRA": "norm.eps=-1"})
    assert bad.returncode == 2 and "norm.eps" in bad.stderr + bad.stdout


BUDGET_ROW = (
    r"^gpu_check:   (\S+(?: \S+)?)\s+(\d+) s  total\s+(\d+) s  (fits|over budget: skipped|over budget: runs anyway)"
)


def budget_rows(out: str) -> dict[str, list]:
    return {name: [int(sec), int(total), how] for name, sec, total, how in re.findall(BUDGET_ROW, out, re.M)}


def node_python(tmp_path: Path) -> Path:
    """A node's python3 that has neither torch nor normbench (and reaches no index)."""
    stub = tmp_path / "python3"
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    return stub


@pytest.mark.slow
def test_budget_plan_adds_up_and_marks_what_does_not_fit():
    # estimates chosen so that the step times vanish (a huge peak): each run is start-up + compile
    common = "model=gpt2_124m data.tokenizer=gpt2 precision=bf16 trainer.batch_size=32 trainer.grad_accum=2"
    cmd = [
        sys.executable,
        str(SCRIPTS / "gpu_budget.py"),
        "--first",
        "pre_ln",
        "--eager",
        "--common",
        common,
        "--gpu",
        "1e21",
        "--start",
        "10",
        "--compile",
        "20",
        "--compile-next",
        "5",
    ]
    out = subprocess.run([*cmd, "--rest", "ngpt rezero", "--budget", "50"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # pre_ln 10 + 20, eager 10, ngpt 10 + 5 (total 55 > 50), rezero 15 (70)
    assert budget_rows(out.stdout) == {
        "pre_ln": [30, 30, "fits"],
        "pre_ln_eager": [10, 40, "fits"],
        "ngpt": [15, 55, "over budget: skipped"],
        "rezero": [15, 70, "over budget: skipped"],
    }
    assert "budget plan: 70 s for 4 runs, does not fit: 2 run(s) skipped by this estimate" in out.stdout
    # the reference runs go first and run whatever the budget
    tight = subprocess.run([*cmd, "--rest", "ngpt", "--budget", "20"], capture_output=True, text=True)
    assert budget_rows(tight.stdout) == {
        "pre_ln": [30, 30, "over budget: runs anyway"],
        "pre_ln_eager": [10, 40, "over budget: runs anyway"],
        "ngpt": [15, 55, "over budget: skipped"],
    }


@pytest.mark.slow
def test_gpu_check_setup_takes_the_offline_install_when_no_index_answers(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    node = node_python(tmp_path)
    env = {"VENV": str(tmp_path / "no-venv"), "NODE_PYTHON": str(node), "INDEX_URL": "http://127.0.0.1:9/simple/"}
    dry = gpu_check({**env, "WHEELS": str(wheels), "DRY_RUN": "1", "ARCHS": "pre_ln", "CLAIM": "none"})
    assert dry.returncode == 0, dry.stderr
    assert f"gpu_check: setup: no {tmp_path}/no-venv, {node} has no normbench: the offline install" in dry.stdout
    want = f"would run: make install-offline WHEELS={wheels} PY={node} VENV={tmp_path}/no-venv"
    assert want in dry.stdout and "budget plan:" in dry.stdout
    if (SCRIPTS.parent / "wheelhouse").is_dir():
        pytest.skip("this checkout has a ./wheelhouse, which the check takes when WHEELS= is not given")
    none = gpu_check({**env, "PYTHON": ""})  # no venv, no normbench, no wheelhouse, no index: one line, how to go on
    assert none.returncode == 2 and len(none.stderr.strip().splitlines()) == 1, none.stderr
    assert "no index reachable at http://127.0.0.1:9/simple/: build a wheelhouse" in none.stderr
    assert "make wheelhouse" in none.stderr and "WHEELS=DIR" in none.stderr


def summary(status="completed", tps=1000.0, fpt=1e9, mfu=0.5, mem=10.0, **kw) -> dict:
    return {
        "status": status,
        "tokens_per_s": tps,
        "flops_per_token": fpt,
        "mfu": mfu,
        "peak_mem_gb": mem,
        "wall_s": 100.0,
        "step_time_s": 1.0,
        "max_steps": 50,
        "final_loss": 7.0,
        **kw,
    }


@pytest.mark.slow
def test_gpu_check_table_reads_summaries(tmp_path):
    runs = {
        "pre_ln": summary(),
        "ngpt": summary(tps=800.0, fpt=1.25e9, mem=12.0),
        "pre_ln_eager": summary(tps=500.0, mfu=0.25),
        "ddp_smoke": summary(world_size=2),
    }
    for name, s in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    proc = gpu_check({"TABLE_ONLY": "1", "OUT": str(tmp_path), "ARCHS": "pre_ln ngpt"})
    assert proc.returncode == 0, proc.stderr
    ngpt = next(line.split() for line in proc.stdout.splitlines() if line.startswith("ngpt "))
    # status, tokens/s, FLOP/s vs pre_ln (800 x 1.25 / 1000), MFU, mem, mem vs pre_ln, mem/estimate, compile s
    assert ngpt[1:7] == ["completed", "800", "1.00", "50.0%", "12.0", "1.20"]
    assert float(ngpt[7]) > 0 and ngpt[8] == "50"  # 100 s wall - 50 steps x 1 s
    assert "compile speed-up, pre_ln: 2.00x" in proc.stdout
    assert "target MFU >= 45% for pre_ln: met (50.0%)" in proc.stdout
    assert "DDP 2-process smoke run: completed (world size 2" in proc.stdout
    # a second try of the skipped archs into the same OUT: pre_ln's row stays the reference
    second = gpu_check({"TABLE_ONLY": "1", "OUT": str(tmp_path), "ARCHS": "ngpt"})
    cells = {line.split()[0]: line.split() for line in second.stdout.splitlines() if line.split()}
    assert second.returncode == 0 and cells["ngpt"][1:4] == ["completed", "800", "1.00"] and "pre_ln" in cells
    (tmp_path / "ngpt" / "summary.json").write_text(json.dumps(summary(status="failed")))
    assert gpu_check({"TABLE_ONLY": "1", "OUT": str(tmp_path), "ARCHS": "pre_ln ngpt"}).returncode == 1


# --------------------------------------------------------------------------- profile_step.py
@pytest.mark.slow
def test_profile_step_sorts_a_steps_time_into_kinds(tmp_path):
    cmd = [sys.executable, str(SCRIPTS / "profile_step.py"), "--set", "model=tiny", "--steps", "2", "--warmup", "1"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line.strip("|").split("|") for line in proc.stdout.splitlines() if line.startswith("| ")]
    rows = {cells[0].strip(): [c.strip() for c in cells] for cells in lines if len(cells) == 3}
    kinds = ["matmul", "attention", "elementwise and reductions", "optimizer", "rest"]
    assert all(k in rows for k in kinds), proc.stdout
    ms = [num(rows[k][1]) for k in kinds]
    assert num(rows["all (self CPU time)"][1]) == pytest.approx(sum(ms), abs=0.1 * len(kinds))
    assert ms[0] > 0 and ms[1] > 0  # tiny's 2 blocks run their products and the SDPA kernel every step
    assert re.search(r"the products themselves: \d+\.\d+ GFLOP per step", proc.stdout)


@pytest.mark.slow
def test_gpu_ckpt_check_times_every_way_of_writing_and_leaves_no_checkpoint(tmp_path):
    """scripts/gpu_ckpt_check.py (gpu_check.sh's checkpoint cost): four ways, each timed; only its table is left."""
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("normbench-ckpt-cost-*"))
    cmd = [
        sys.executable,
        str(SCRIPTS / "gpu_ckpt_check.py"),
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "out" / "ckpt_cost.json").read_text())
    ways = {(r["format"], r["background"]) for r in rows}
    assert ways == {("file", False), ("file", True), ("dcp", False), ("dcp", True)}
    assert all(0 < r["blocking_s"] <= r["total_s"] and r["bytes"] > 0 for r in rows)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ckpt_cost.json", "out"]
    assert set(Path(tempfile.gettempdir()).glob("normbench-ckpt-cost-*")) == before
