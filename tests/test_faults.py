"""Fault injection: signals, kill -9 (also inside a checkpoint write), corrupt and foreign checkpoints,
changed configs, the run-directory lock, non-finite gradients, divergence, failing sweep jobs.

Every resumed run is compared with one uninterrupted run of the same config, record by record, to the
last bit (CPU). Test hooks used (normbench_test_hooks.py): ``NORMBENCH_TEST_SLOW_LOG`` (sleep after each
metrics record, so a signal lands mid-run), ``NORMBENCH_TEST_SLOW_CKPT`` (a half-written temp checkpoint stays that many
seconds), ``NORMBENCH_TEST_NAN_GRAD`` (NaN gradients at given steps) and ``NORMBENCH_TEST_FAIL_AT_STEP``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from normbench import cli, report
from normbench.errors import ConfigError
from normbench.run import lock as runlock
from normbench.run import rundir
from normbench.run.metrics import JsonlWriter, read_jsonl
from normbench.train import build, trainer
from normbench.train import checkpoint as ckpt

from conftest import OFFLINE_ENV, compose, run_cli

# 12 steps, a record every step, evals at 6 and 12, checkpoints at 4 and 8, diagnostics too
RUN = [
    "model=tiny",
    "model.seq_len=32",
    "trainer.batch_size=2",
    "trainer.max_steps=12",
    "trainer.log_every=1",
    "trainer.eval_every=6",
    "trainer.eval_batches=2",
    "trainer.ckpt_every=4",
    "diag.every=6",
]
COMPARED = ("step", "tokens", "loss", "lr", "grad_norm", "val_loss", "var_resid", "grad_norm_layer", "spikes")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every interrupted-and-resumed run must equal."""
    cwd = tmp_path_factory.mktemp("reference")
    run_cli(["train", *RUN, "hydra.run.dir=run"], cwd=cwd, check=True)
    return cwd / "run"


def start(cwd: Path, *args: str, **env: str) -> subprocess.Popen:
    """``python -m normbench train ARGS`` in the background; output goes to cwd/out.txt, cwd/err.txt."""
    return subprocess.Popen(
        [sys.executable, "-m", "normbench", "train", *args],
        cwd=cwd,
        env={**os.environ, **OFFLINE_ENV, **env},
        stdout=open(cwd / "out.txt", "w"),  # closed with the process
        stderr=open(cwd / "err.txt", "w"),
    )


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the moment to interrupt it"
        assert time.monotonic() < end, "timed out waiting for the run"
        time.sleep(0.02)


def steps(run: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run / "metrics.jsonl")]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def assert_same_run(run: Path, ref: Path) -> None:
    """Same records at the same steps, each step once, same final summary numbers."""
    got, want = read_jsonl(run / "metrics.jsonl"), read_jsonl(ref / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, 13)), "every step exactly once"
    for key in COMPARED:
        assert [r.get(key) for r in got] == [r.get(key) for r in want], key
    s, r = summary(run), summary(ref)
    assert s["status"] == "completed" and s["step"] == 12
    for key in ("final_loss", "final_val_loss", "best_val_loss", "spikes", "skipped_steps"):
        assert s[key] == r[key], key
    assert not (run / ".lock").exists()
    assert not list((run / "checkpoints").glob(".last.pt.tmp.*")), "no temp checkpoint left behind"


# ------------------------------------------------------------------------------------------- interruption
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_signal_checkpoints_marks_interrupted_and_resume_matches(tmp_path, reference, sig):
    run = tmp_path / "run"
    proc = start(tmp_path, *RUN, "hydra.run.dir=run", NORMBENCH_TEST_SLOW_LOG="0.15")
    wait_for(lambda: len(steps(run)) >= 5, proc)
    # while it runs, the directory is locked: a second run is refused with the owner's pid
    with pytest.raises(runlock.RunDirInUse, match=f"in use by process {socket.gethostname()}:{proc.pid}"):
        runlock.RunLock(run).check_free()
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 128 + sig
    assert "Traceback" not in (tmp_path / "err.txt").read_text()

    s = summary(run)
    assert s["status"] == "interrupted"
    assert signal.Signals(sig).name in s["reason"] and "trainer.resume=true" in s["reason"]
    assert 5 <= s["step"] < 12
    assert ckpt.load(run / "checkpoints" / "last.pt")["step"] == s["step"], "checkpoint at the current step"
    assert not (run / ".lock").exists()

    proc = run_cli(["train", *RUN, "hydra.run.dir=run", "trainer.resume=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run / 'checkpoints' / 'last.pt'} at step {s['step']}" in proc.stdout
    assert_same_run(run, reference)


def resume_line(out: str, what: str = "this run") -> list[str]:
    """The resume command the interrupted process printed, ready to run here."""
    (line,) = [ln for ln in out.splitlines() if f"resume {what} with: " in ln]
    argv = shlex.split(line.split(f"resume {what} with: ", 1)[1])
    assert argv[:4] == ["python", "-m", "normbench", "train"], argv
    return argv[4:]


@pytest.mark.slow
def test_signal_during_the_final_eval_interrupts_and_the_printed_command_finishes_the_run(tmp_path, reference):
    """SIGTERM while the last step's evaluation runs: the evaluation stops (it saves nothing), the run ends
    `interrupted` with exit 143 (it used to report `completed` and exit 0); the command it prints resumes
    this very run (hydra.run.dir included), evaluates, and ends with the uninterrupted run's numbers."""
    run = tmp_path / "run"
    proc = start(tmp_path, *RUN, "hydra.run.dir=run", NORMBENCH_TEST_SLOW_EVAL="8")
    wait_for(lambda: 11 in steps(run), proc)  # step 12 and its evaluation (2 batches x 8 s) come next
    time.sleep(0.8)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    # The evaluation was cut short, not waited for: no val_loss in the last record and the reason says so
    # (asserted below from the run's own files, not from a wall-clock limit that a loaded machine can miss).
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert "Traceback" not in err
    s = summary(run)
    assert s["status"] == "interrupted" and s["step"] == 12, s
    assert "evaluation was cut short" in s["reason"]
    assert "val_loss" not in read_jsonl(run / "metrics.jsonl")[-1]
    assert f"run interrupted at step 12: final loss {s['final_loss']:.4f} (step 12)" in out
    assert f"run directory: {run.resolve()}" in out

    args = resume_line(out)
    assert f"hydra.run.dir={run.resolve()}" in args and args[-1] == "trainer.resume=true"
    elsewhere = tmp_path / "elsewhere"  # the command names the run's directory: it works from anywhere
    elsewhere.mkdir()
    proc = run_cli(["train", *args], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert_same_run(run, reference)


@pytest.mark.parametrize("how", ["second signal", "no safe point within the grace"])
def test_a_step_that_does_not_end_exits_at_once_keeping_the_last_checkpoint(tmp_path, how):
    """Step 6 never ends (a test hook): a second signal, or the grace after the first, ends the process at
    once (`timeout`'s SIGTERM used to be ignored for minutes); the summary says interrupted; the step-4
    checkpoint stays."""
    run = tmp_path / "run"
    grace = "60" if how == "second signal" else "1"
    proc = start(tmp_path, *RUN, "hydra.run.dir=run", f"trainer.stop_grace_s={grace}", NORMBENCH_TEST_HANG_AT_STEP="6")
    wait_for(lambda: (run / "checkpoints" / "last.pt").exists() and 5 in steps(run), proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    if how == "second signal":
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    assert time.monotonic() - sent < 10
    assert code == (130 if how == "second signal" else 143)
    s = summary(run)
    assert s["status"] == "interrupted", s
    assert ("a second signal" if how == "second signal" else "stop_grace_s=1") in s["reason"]
    assert "stopped at once" in (tmp_path / "err.txt").read_text()
    assert ckpt.load(run / "checkpoints" / "last.pt")["step"] == 4, "the last complete checkpoint is kept"
    assert not (run / ".lock").exists()


@pytest.mark.slow
def test_signal_in_a_sweep_stops_it_and_the_printed_command_resumes_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *RUN, "trainer.max_steps=6", "seed=0,1", "hydra.sweep.dir=sweep"]
    proc = start(tmp_path, *args, NORMBENCH_TEST_SLOW_LOG="0.2")
    job0 = lambda: next(iter(sweep.glob("0_*")), None)
    wait_for(lambda: job0() is not None and len(steps(job0())) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert summary(job0())["status"] == "interrupted"
    assert not list(sweep.glob("1_*")), "no job starts after the signal"
    out = (tmp_path / "out.txt").read_text()
    assert f"sweep directory: {sweep.resolve()}" in out
    cmd = resume_line(out, "the sweep")
    assert cmd[0] == "-m" and f"hydra.sweep.dir={sweep.resolve()}" in cmd
    proc = run_cli(["train", *cmd], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    jobs = sorted(sweep.glob("*_*"))
    assert [summary(j)["status"] for j in jobs] == ["completed", "completed"]
    assert steps(jobs[0]) == list(range(1, 7))


def test_signal_after_the_last_safe_point_completes_then_stops(tmp_path, monkeypatch):
    """A signal during the final checkpoint write: the run is complete (nothing is lost), and the
    process still leaves with 143 so that a sweep goes no further."""
    from normbench.train.signals import STOP

    original = trainer.Trainer.save_checkpoint

    def save_then_signal(self):
        original(self)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer.Trainer, "save_checkpoint", save_then_signal)
    installed = STOP.install([signal.SIGTERM])  # as the CLI does for the whole command
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main(["train", *RUN, "trainer.max_steps=2", "trainer.ckpt_every=100", f"hydra.run.dir={tmp_path}"])
    finally:
        STOP.uninstall(installed)
    assert exc.value.code == 143
    assert summary(tmp_path)["status"] == "completed"


# ------------------------------------------------------------------------------------------- kill -9
KILL_POINTS = [
    "inside_checkpoint_write",
    pytest.param("before_first_checkpoint", marks=pytest.mark.slow),
    pytest.param("between_checkpoints", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill9_then_resume_loses_nothing(tmp_path, reference, point):
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.pt"
    temps = lambda: list((run / "checkpoints").glob(".last.pt.tmp.*"))
    env = {"NORMBENCH_TEST_SLOW_LOG": "0.15"}
    if point == "inside_checkpoint_write":
        env["NORMBENCH_TEST_SLOW_CKPT"] = "1.0"
        moment = lambda: last.exists() and temps()  # the step-8 checkpoint is half written
    elif point == "before_first_checkpoint":
        moment = lambda: len(steps(run)) >= 2
    else:
        moment = lambda: len(steps(run)) >= 6  # step 4 checkpointed, step 8 not yet
    proc = start(tmp_path, *RUN, "hydra.run.dir=run", **env)
    wait_for(moment, proc)
    proc.kill()
    proc.wait(timeout=60)

    assert summary(run)["status"] == "running", "a killed run says so until it is resumed"
    assert (run / ".lock").exists(), "the dead process's lock is still there"
    if point == "before_first_checkpoint":
        assert not last.exists()
    else:
        assert ckpt.load(last)["step"] == 4, "last.pt is the previous complete checkpoint"
        assert max(steps(run)) > 4, "metrics past the checkpoint exist and must be dropped"
    if point == "inside_checkpoint_write":
        assert temps(), "the torn temp file was left behind"
    # a crash mid-write of metrics.jsonl leaves a torn last line: every reader skips it
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "loss": 1.2')
    assert steps(run)[-1] != 99 and [r["step"] for r in report.read_metrics(run / "metrics.jsonl")] == steps(run)

    proc = run_cli(["train", *RUN, "hydra.run.dir=run", "trainer.resume=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_same_run(run, reference)


def test_torn_and_corrupt_metrics_lines_are_tolerated(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe garbage\n[1, 2]\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    assert [r["step"] for r in report.read_metrics(path)] == [1, 2]
    writer = JsonlWriter(path)  # appending never glues a record onto the torn line
    writer.write({"step": 3, "loss": 1.0})
    writer.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    JsonlWriter(path, resume_step=2).close()  # resume at step 2: later and torn records go
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    assert path.read_text().endswith("}\n")


def test_checkpoint_write_is_atomic_and_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.pt"
    minimal = dict.fromkeys(ckpt.REQUIRED_KEYS, 0)  # what load() insists on
    ckpt.save_atomic({**minimal, "model": {"w": torch.ones(2)}, "step": 1}, path)
    stale = path.with_name(".last.pt.tmp.999999")
    stale.write_bytes(b"half a checkpoint")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        ckpt.save_atomic({**minimal, "model": {"w": torch.zeros(2)}, "step": 2}, path)
    assert ckpt.load(path)["step"] == 1, "a failed write keeps the previous checkpoint"
    assert not list(path.parent.glob(".last.pt.tmp.*")), "temp files (ours and a dead writer's) are removed"


# ------------------------------------------------------------------------------------------- corrupt files
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A finished 2-step run (RUN with max_steps=2) to copy and damage."""
    run = tmp_path_factory.mktemp("saved") / "run"
    trainer.run(compose([*RUN, "trainer.max_steps=2"]), run)
    return run


def resume(capsys, run: Path, *extra: str) -> tuple[int, str]:
    """``train RUN trainer.max_steps=2 ... trainer.resume=true`` in-process: (exit code, stderr)."""
    capsys.readouterr()
    try:
        code = cli.main(["train", *RUN, "trainer.max_steps=2", *extra, "trainer.resume=true", f"hydra.run.dir={run}"])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def copy_of(saved_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    return run


class Evil:
    """Unpickling this would run code: it creates the file ``path``."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _damage(kind: str, path: Path, tmp_path: Path) -> Path | None:
    marker = tmp_path / "PWNED"
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random bytes":
        path.write_bytes(os.urandom(len(data)))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "pickled code (torch.save)":
        torch.save({"model": Evil(marker), "step": 1}, path)
    elif kind == "pickled code (plain pickle)":
        import pickle

        path.write_bytes(pickle.dumps({"model": Evil(marker), "step": 1}))
    elif kind == "not a normbench checkpoint":
        torch.save({"weights": torch.ones(3)}, path)
    return marker


@pytest.mark.parametrize(
    "kind,needle",
    [
        ("truncated", "truncated or corrupt"),
        ("random bytes", "truncated or corrupt"),
        ("empty", "truncated or corrupt"),
        ("pickled code (torch.save)", "pickled objects other than tensors"),
        ("pickled code (plain pickle)", "truncated or corrupt"),  # not a torch.save archive: never unpickled
        ("not a normbench checkpoint", "not a normbench checkpoint"),
    ],
)
def test_damaged_checkpoint_is_refused_in_one_line(tmp_path, capsys, saved_run, kind, needle):
    run = copy_of(saved_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    marker = _damage(kind, last, tmp_path)
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(capsys, run)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"normbench: error: checkpoint {last}") and needle in err, err
    assert "Traceback" not in err
    assert not marker.exists(), "loading a checkpoint never runs its code"
    assert (run / "metrics.jsonl").read_text() == before, "a refused resume changes nothing"


def test_pickled_code_never_runs_even_through_load(tmp_path):
    marker = tmp_path / "PWNED"
    torch.save({"model": Evil(marker), "step": 1}, tmp_path / "evil.pt")
    with pytest.raises(ConfigError, match="weights_only=True"):
        ckpt.load(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)["model"].close()  # the control: it really runs code
    assert marker.exists()


def test_checkpoint_of_another_model_is_refused_naming_the_keys(tmp_path, capsys, saved_run):
    run = copy_of(saved_run, tmp_path)
    code, err = resume(capsys, run, "model.d_model=128", "arch=post_ln")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(run / "checkpoints" / "last.pt") in err and "different model" in err
    assert "model.d_model (64 -> 128)" in err and "arch.name (pre_ln -> post_ln)" in err


def test_refused_resume_leaves_the_runs_hydra_files_as_they_were(tmp_path, capsys):
    """Hydra rewrites .hydra/ before the job starts; a refused resume puts the old files back."""
    run = tmp_path / "run"
    assert cli.main(["train", *RUN, "trainer.max_steps=2", f"hydra.run.dir={run}"]) == 0
    before = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    assert "arch=post_ln" not in before["overrides.yaml"].decode()
    code, _ = resume(capsys, run, "arch=post_ln")
    assert code == 2
    assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == before


def test_checkpoint_whose_tensors_do_not_fit_is_refused(tmp_path, capsys, saved_run):
    run = copy_of(saved_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(3, 3)  # same config, foreign shapes
    torch.save(state, last)
    code, err = resume(capsys, run)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"checkpoint {last} does not fit this model" in err and name in err


def test_changed_config_is_refused_unless_allowed(tmp_path, capsys, saved_run):
    run = copy_of(saved_run, tmp_path)
    lr = compose(RUN).optim.lr
    code, err = resume(capsys, run, f"optim.lr={lr * 2}")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"different config: optim.lr ({lr} -> {lr * 2})" in err
    assert "trainer.resume_allow_changed=[optim.lr]" in err

    # extending the run: allowed with the documented override; the metrics continue without repeats
    capsys.readouterr()
    code = cli.main(
        [
            "train",
            *RUN,
            "trainer.max_steps=8",
            "trainer.resume=true",
            "trainer.resume_allow_changed=[trainer.max_steps]",
            f"hydra.run.dir={run}",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 2 (changed: trainer.max_steps)" in out
    assert "run length changed 2 -> 8 steps" in out  # the cosine schedule is laid over the new length
    assert steps(run) == list(range(1, 9))
    assert summary(run)["status"] == "completed" and summary(run)["step"] == 8

    # shortening below the checkpoint's step makes no sense: refused
    code, err = resume(capsys, run, "trainer.resume_allow_changed=[trainer.max_steps]")
    assert code == 2 and "is at step 8, past trainer.max_steps=2" in err, err


def test_resume_of_a_finished_run_keeps_its_summary(tmp_path, saved_run):
    run = copy_of(saved_run, tmp_path)
    before = summary(run)
    again = trainer.run(compose([*RUN, "trainer.max_steps=2", "trainer.resume=true"]), run)
    assert again["status"] == "completed" and again["step"] == 2
    for key in ("final_loss", "final_val_loss", "best_val_loss"):
        assert again[key] == before[key] is not None, key
    assert steps(run) == [1, 2]


def _preempted_run(monkeypatch, run: Path, at_step: int, launcher_handler, raises) -> None:
    """Train RUN (8 steps) with ``launcher_handler`` on SIGUSR2 (as submitit installs it); the signal
    arrives during step ``at_step``; the run must end by raising ``raises``."""
    original = trainer.Trainer.optimizer_step

    def preempt(self, grad_norm):
        if self.step == at_step - 1:
            os.kill(os.getpid(), signal.SIGUSR2)
        return original(self, grad_norm)

    monkeypatch.setattr(trainer.Trainer, "optimizer_step", preempt)
    previous = signal.signal(signal.SIGUSR2, launcher_handler)
    try:
        with pytest.raises(raises):
            trainer.run(compose([*RUN, "trainer.max_steps=8"]), run)
        assert signal.getsignal(signal.SIGUSR2) is launcher_handler, "the launcher's handler is back"
    finally:
        signal.signal(signal.SIGUSR2, previous)
        monkeypatch.setattr(trainer.Trainer, "optimizer_step", original)


def test_preemption_signal_checkpoints_then_goes_on_to_submitit(tmp_path, monkeypatch):
    """Under hydra-submitit-launcher, submitit's USR2 handler requeues the job: normbench writes the
    checkpoint at the end of the step first, then calls it."""
    run = tmp_path / "run"
    calls = []

    def submitit_handler(signum, frame):  # stands in for submitit's checkpoint_and_try_requeue
        calls.append((signum, ckpt.load(run / "checkpoints" / "last.pt")["step"], summary(run)["status"]))
        raise SystemExit(-1)  # submitit exits the job once it is requeued

    _preempted_run(monkeypatch, run, 3, submitit_handler, SystemExit)
    assert calls == [(signal.SIGUSR2, 3, "interrupted")], "checkpoint at the step, then the requeue"
    assert "SIGUSR2 at step 3" in summary(run)["reason"]
    assert not (run / ".lock").exists()
    # the requeued job runs the same command; with trainer.resume=true it continues from step 3
    assert trainer.run(compose([*RUN, "trainer.max_steps=8", "trainer.resume=true"]), run)["status"] == "completed"
    assert steps(run) == list(range(1, 9))


def test_preemption_that_is_not_requeued_stays_interrupted(tmp_path, monkeypatch):
    """submitit gives up (timed out too many times) by raising: the run stays `interrupted`, resumable."""
    run = tmp_path / "run"

    def submitit_gives_up(signum, frame):
        raise RuntimeError("Job not requeued because: timed-out too many times.")

    _preempted_run(monkeypatch, run, 2, submitit_gives_up, RuntimeError)
    s = summary(run)
    assert s["status"] == "interrupted" and rundir.RunDir(run).status() == "interrupted"
    assert "SIGUSR2 at step 2" in s["reason"] and "not requeued: Job not requeued" in s["reason"]
    assert ckpt.load(run / "checkpoints" / "last.pt")["step"] == 2


def test_fresh_run_into_a_used_dir_sets_the_old_checkpoint_aside(tmp_path, saved_run, monkeypatch):
    run = copy_of(saved_run, tmp_path)
    monkeypatch.setenv("NORMBENCH_TEST_FAIL_AT_STEP", "1")  # the fresh run crashes before its first checkpoint
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.run(compose([*RUN, "trainer.max_steps=2"]), run)
    assert summary(run)["status"] == "failed"
    (kept,) = (run / "checkpoints").glob("replaced-*.pt")
    assert ckpt.load(kept)["step"] == 2, "the old run's checkpoint is kept, under another name"
    assert not (run / "checkpoints" / "last.pt").exists()
    monkeypatch.delenv("NORMBENCH_TEST_FAIL_AT_STEP")
    # so a resume continues the run that was started last (from step 0), not the old one
    assert trainer.run(compose([*RUN, "trainer.max_steps=2", "trainer.resume=true"]), run)["status"] == "completed"
    assert steps(run) == [1, 2]


def test_resume_without_a_checkpoint_starts_fresh(tmp_path):
    # what a requeued job sees the first time: trainer.resume=true from the start is always safe
    result = trainer.run(compose([*RUN, "trainer.max_steps=2", "trainer.resume=true"]), tmp_path / "run")
    assert result["status"] == "completed" and steps(tmp_path / "run") == [1, 2]


# ------------------------------------------------------------------------------------------- the lock
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_live_lock_refuses_a_second_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = runlock.RunLock(run)
    holder.acquire()
    try:
        capsys.readouterr()
        code = cli.main(["train", *RUN, f"hydra.run.dir={run}"])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"run directory {run} is in use by process {socket.gethostname()}:{os.getpid()}" in err
        assert not (run / ".hydra").exists(), "refused before Hydra writes into the directory"
        with pytest.raises(runlock.RunDirInUse):  # the lock the run itself takes (sweeps, torchrun)
            runlock.RunLock(run).acquire()
    finally:
        holder.release()
    assert not (run / ".lock").exists()


def test_sweep_job_into_a_live_run_dir_leaves_that_run_alone(tmp_path, capsys):
    job = tmp_path / "sweep" / "job0"
    job.mkdir(parents=True)
    (job / "summary.json").write_text('{"status": "running", "step": 7}')
    holder = runlock.RunLock(job)
    holder.acquire()
    try:
        code = cli.main(
            ["train", "-m", *RUN, "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
            + ["hydra.sweep.subdir=job${hydra.job.num}"]
        )
    finally:
        holder.release()
    err = capsys.readouterr().err
    assert code == 0 and f"run directory {job} is in use" in err
    assert json.loads((job / "summary.json").read_text()) == {"status": "running", "step": 7}, "not overwritten"
    assert not (job / "metrics.jsonl").exists()


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_notice(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dead = f"{socket.gethostname()}:{_dead_pid()}"
    (run / ".lock").write_text(dead)  # what an OOM-killed run leaves, with its "running" summary
    (run / "summary.json").write_text('{"status": "running", "step": 7}')
    assert trainer.run(compose([*RUN, "trainer.max_steps=2"]), run)["status"] == "completed"
    assert not (run / ".lock").exists()
    (notice,) = [ln for ln in (run / "train.log").read_text().splitlines() if "stale lock" in ln]
    assert f"from {dead} (process {dead.split(':')[1]} is gone" in notice
    # the steps are metrics.jsonl's and the checkpoint's (tests/test_preemption.py), never summary.json's
    assert notice.endswith(
        "taken over; it died without a word (killed, or out of memory?) before logging a step; "
        "trainer.resume=false: this run starts over from step 0"
    )


def test_stale_lock_from_another_host(tmp_path):
    """Another node's lock that no process holds: taken over (a requeue), unless that run wrote moments
    ago (flock is not coherent across hosts on every network filesystem): then refused, saying what to do."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("node-17:4242")
    (run / "summary.json").write_text('{"status": "running", "step": 3}')
    with pytest.raises(runlock.RunDirInUse, match=r"locked by node-17:4242 on another host, which wrote to it \d+ s"):
        runlock.RunLock(run).acquire()
    hour_ago = time.time() - 3600
    os.utime(run / "summary.json", (hour_ago, hour_ago))
    lock = runlock.RunLock(run)
    lock.acquire()
    try:
        assert (run / ".lock").read_text() == f"{socket.gethostname()}:{os.getpid()}"
    finally:
        lock.release()


def test_corrupt_summary_is_unreadable_not_failed(tmp_path):
    read_summary = lambda run: rundir.RunDir(run).read_summary()

    run = tmp_path / "sweep" / "0_seed=0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"status": "completed", "final_lo')
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    assert read_summary(run)["status"] == "unreadable"
    assert read_summary(tmp_path) is None  # no file: no summary
    assert report.load_run(run).status == "unreadable"
    assert report.main([str(tmp_path / "sweep")]) == 0
    text = (tmp_path / "sweep" / "report.md").read_text()
    assert "1 unreadable" in text and "1 failed" not in text  # the counts, not the legend prose


def test_lock_without_flock_falls_back_to_the_pid(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    lock_file = tmp_path / ".lock"
    lock_file.write_text(f"{socket.gethostname()}:{_dead_pid()}")
    lock = runlock.RunLock(tmp_path)
    lock.acquire()  # dead owner: taken over
    assert lock_file.read_text() == f"{socket.gethostname()}:{os.getpid()}"
    lock.release()
    lock_file.write_text(f"{socket.gethostname()}:{os.getppid()}")  # a live owner
    with pytest.raises(runlock.RunDirInUse):
        runlock.RunLock(tmp_path).acquire()


# ------------------------------------------------------------------------------------------- non-finite
def test_nonfinite_gradients_are_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMBENCH_TEST_NAN_GRAD", "3,5")
    args = [*RUN, "trainer.max_steps=8"]
    skipped = trainer.run(compose([*args, "trainer.skip_nonfinite=true"]), tmp_path / "skip")
    assert skipped["status"] == "completed" and skipped["skipped_steps"] == 2
    records = read_jsonl(tmp_path / "skip" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 9))
    nan_norms = [r["step"] for r in records if r["grad_norm"] is None]  # NaN is written as null
    assert nan_norms == [3, 5]
    state = ckpt.load(tmp_path / "skip" / "checkpoints" / "last.pt")
    assert all(torch.isfinite(t).all() for t in state["model"].values()), "no NaN reached the weights"

    plain = trainer.run(compose(args), tmp_path / "plain")  # without skipping, the NaN poisons the model
    assert plain["status"] == "diverged" and "non-finite" in plain["reason"]
    assert plain["reason"].endswith("at step 4")  # the first NaN loss: the step after the NaN gradients


def test_fp16_loss_scaler_skips_overflows_apart_and_resumes_its_scale(tmp_path, monkeypatch):
    """GradScaler (fp16) skips an overflowing step and halves its scale: counted in amp_skipped_steps,
    never toward trainer.max_skipped; the scale and its growth counter are checkpointed. fp16 needs a
    GPU, so the test gives the fp32 trainer a CPU GradScaler: the same code path."""
    monkeypatch.setattr(build, "make_scaler", lambda device, precision: torch.amp.GradScaler("cpu", init_scale=1024.0))
    monkeypatch.setenv("NORMBENCH_TEST_NAN_GRAD", "3")
    run = tmp_path / "run"
    args = [*RUN, "trainer.skip_nonfinite=true", "trainer.max_skipped=0"]  # a skip of its own would diverge
    first = trainer.run(compose([*args, "trainer.max_steps=4"]), run)
    assert first["status"] == "completed" and (first["amp_skipped_steps"], first["skipped_steps"]) == (1, 0)
    state = ckpt.load(run / "checkpoints" / "last.pt")
    assert state["scaler"]["scale"] == 512.0 and state["amp_skipped"] == 1
    assert all(torch.isfinite(t).all() for t in state["model"].values()), "no NaN reached the weights"

    monkeypatch.setenv("NORMBENCH_TEST_NAN_GRAD", "")
    resume = ["trainer.resume=true", "trainer.resume_allow_changed=[trainer.max_steps]", "trainer.max_steps=6"]
    again = trainer.run(compose([*args, *resume]), run)
    assert again["status"] == "completed" and again["amp_skipped_steps"] == 1
    assert ckpt.load(run / "checkpoints" / "last.pt")["scaler"]["scale"] == 512.0  # not a fresh 1024


def test_huge_lr_diverges_and_exits_zero(tmp_path, capsys):
    run = tmp_path / "run"
    code = cli.main(["train", *RUN, "optim.lr=1e3", "sched.warmup_steps=0", f"hydra.run.dir={run}"])
    assert code == 0
    s = summary(run)
    assert s["status"] == "diverged" and s["reason"] and s["step"] < 12


# ------------------------------------------------------------------------------------------- sweeps
@pytest.mark.slow
def test_failed_jobs_are_recorded_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "data").mkdir()
    docs = "".join(json.dumps({"text": f"hello, small file {i}.\n"}) + "\n" for i in range(38))
    (tmp_path / "data" / "small.jsonl").write_text(docs)  # two documents held out: 46 validation tokens
    proc = run_cli(
        [
            "train",
            "-m",
            *RUN,
            "data=files",
            "data.paths=[data/small.jsonl]",  # a '/' in a value: job directory names stay flat
            "model.seq_len=16,64",  # 64 > the validation split: found in the job, not before the sweep
            "trainer.max_steps=2,4",  # 4 steps meet the simulated crash at step 3
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
        env={"NORMBENCH_TEST_FAIL_AT_STEP": "3"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    jobs = {p.name.split("_", 1)[0]: summary(p) for p in (tmp_path / "sweep").iterdir() if p.is_dir()}
    assert sorted(jobs) == ["0", "1", "2", "3"], "every job ran, each in a directory right below the sweep's"
    assert all("data.paths=[small.jsonl]" in p.name for p in (tmp_path / "sweep").glob("*_*"))
    assert jobs["0"]["status"] == "completed"
    assert jobs["1"]["status"] == "failed" and "simulated crash at step 3" in jobs["1"]["reason"]
    assert jobs["1"]["step"] in (2, 3), "the failed job's summary says how far it got"
    for job in ("2", "3"):
        assert jobs[job]["status"] == "failed" and "longer than the validation split" in jobs[job]["reason"]

    assert report.main([str(tmp_path / "sweep")]) == 0
    text = (tmp_path / "sweep" / "report.md").read_text()
    assert "failed" in text and "simulated crash at step 3" in text and "longer than the validation split" in text


def test_checkpoint_without_resume_state_is_refused_in_one_line(tmp_path):
    path = tmp_path / "last.pt"
    torch.save({"model": {}, "step": 3}, path)  # loads with weights_only, but cannot be resumed
    with pytest.raises(ConfigError, match=r"not a normbench checkpoint \(no optimizer, tokens, sampler_rng"):
        ckpt.load(path)
