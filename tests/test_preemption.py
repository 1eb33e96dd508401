"""A run or a sweep killed without a word (SIGKILL: a scheduler's preemption, the OOM killer), as its user
sees it afterwards: no temp files of killed writes left behind, a stale-lock notice with the right steps,
``report`` calling the run ``stopped`` (resumable) with the command that resumes it, and a half-finished
sweep's jobs that never started named with the command that finishes the sweep (issue 45).

Kills land inside a write with ``NORMBENCH_TEST_SLOW_WRITE`` (an atomic write waits with its temp file
written) or between checkpoints with ``NORMBENCH_TEST_SLOW_LOG`` (tests/normbench_test_hooks.py).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from normbench import report
from normbench.run import lock as runlock
from normbench.train import checkpoint as ckpt
from test_faults import RUN, start, steps, summary, wait_for
from test_report import all_runs, config, fake_records, make_run, summary_for, table

from conftest import run_cli

WAIT = 300  # seconds to wait for a moment in a run: the test machine's cores are shared


def temp_files(run: Path) -> list[str]:
    return sorted(p.name for d in (run, run / "checkpoints") if d.is_dir() for p in d.glob(".*.tmp.*"))


def kill(proc: subprocess.Popen) -> None:
    proc.kill()  # SIGKILL: no handler, no finally
    proc.wait(timeout=60)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------------------------------- temp files
@pytest.mark.slow
def test_temp_files_of_killed_summary_and_metrics_writes_are_swept(tmp_path):
    run = tmp_path / "run"
    args = [*RUN, "hydra.run.dir=run", "trainer.resume=true"]  # what a requeued job runs, every time
    # killed while its start-up summary.json is written: the complete temp file was never renamed
    first = start(tmp_path, *args, NORMBENCH_TEST_SLOW_WRITE="summary.json:600")
    wait_for(lambda: (run / f".summary.json.tmp.{first.pid}").exists(), first, WAIT)
    kill(first)
    assert temp_files(run) == [f".summary.json.tmp.{first.pid}"]
    # the next start takes the lock and sweeps it; killed in turn while it rewrites metrics.jsonl
    second = start(tmp_path, *args, NORMBENCH_TEST_SLOW_WRITE="metrics.jsonl:600")
    wait_for(lambda: (run / f".metrics.jsonl.tmp.{second.pid}").exists(), second, WAIT)
    kill(second)
    assert temp_files(run) == [f".metrics.jsonl.tmp.{second.pid}"], "the first one's temp file is gone"

    proc = run_cli(["train", *args], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert summary(run)["status"] == "completed" and steps(run) == list(range(1, 13))
    assert temp_files(run) == [], "a run that completes leaves no temp file"


def test_the_lock_holder_sweeps_dead_writers_temp_files_when_it_takes_the_lock_and_when_it_leaves(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    dead, me = dead_pid(), os.getpid()

    def plant() -> None:
        for name in (f".summary.json.tmp.{dead}", f".summary.json.tmp.{dead}.exit", f".metrics.jsonl.tmp.{dead}"):
            (tmp_path / name).write_text("")
        (tmp_path / "checkpoints" / f".last.pt.tmp.{dead}").write_bytes(b"half a checkpoint")

    plant()
    (tmp_path / f".summary.json.tmp.{me}").write_text("")  # this process's own write may be in flight
    (tmp_path / f".layer_skip.json.tmp.{dead}").write_text("")  # not the trainer's: reproduce writes it
    kept = [f".layer_skip.json.tmp.{dead}", f".summary.json.tmp.{me}"]
    lock = runlock.RunLock(tmp_path)
    lock.acquire()
    assert temp_files(tmp_path) == kept
    plant()
    lock.release()
    assert temp_files(tmp_path) == kept and not (tmp_path / ".lock").exists()


# ------------------------------------------------------------------------------------------- a killed run
@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, int, int]:
    """A run killed by SIGKILL between its checkpoints: (its directory, the last step logged, the checkpoint's)."""
    cwd = tmp_path_factory.mktemp("killed")
    run = cwd / "run"
    proc = start(cwd, *RUN, "hydra.run.dir=run", NORMBENCH_TEST_SLOW_LOG="0.3")
    wait_for(lambda: len(steps(run)) >= 6, proc, WAIT)  # step 4 checkpointed, step 8 not yet
    kill(proc)
    logged, at = max(steps(run)), ckpt.load(run / "checkpoints" / "last.pt")["step"]
    assert logged > at == summary(run)["step"], "metrics.jsonl runs past the checkpoint; summary.json does not"
    return run, logged, at


def copy_of(killed, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(killed[0], run)
    return run


@pytest.mark.slow
def test_stale_lock_notice_names_the_last_logged_step_and_the_step_the_resume_goes_on_from(tmp_path, killed):
    _, logged, at = killed
    run = copy_of(killed, tmp_path)
    proc = run_cli(["train", *RUN, "hydra.run.dir=run", "trainer.resume=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (notice,) = [ln for ln in (run / "train.log").read_text().splitlines() if "stale lock" in ln]
    assert "taken over; it died without a word (killed, or out of memory?)" in notice
    assert notice.endswith(
        f"after logging step {logged} (metrics.jsonl); this run resumes from its checkpoint at step {at}"
    )
    assert f"resumed from {run / 'checkpoints' / 'last.pt'} at step {at}" in proc.stdout
    assert summary(run)["status"] == "completed" and steps(run) == list(range(1, 13))


def test_report_calls_a_killed_run_stopped_apart_from_failures_with_the_command_that_resumes_it(tmp_path, killed):
    _, logged, _ = killed
    run = copy_of(killed, tmp_path / "runs")
    assert report.main([str(tmp_path / "runs"), "--no-figures"]) == 0
    md = (tmp_path / "runs" / "report.md").read_text()
    (row,) = table(md, "group").values()
    assert row["status"] == "1 stopped" and row["outcomes"] == "1 stopped", "not a failure"
    assert "failed" not in row["status"] + row["outcomes"]
    reason = all_runs(md)["run"]["reason"]
    assert reason.startswith(f"died without a word after logging step {logged} (killed, out of memory or a lost node?)")
    command = reason.split("resume with: ", 1)[1]
    assert shlex.split(command) == [
        "python",
        "-m",
        "normbench",
        "train",
        *RUN,
        f"hydra.run.dir={run}",
        "trainer.resume=true",
    ]


def test_a_stopped_run_is_one_that_no_live_process_holds():
    """A ``running`` summary is ``running`` while its lock's owner lives, ``stopped`` once it is gone; a
    directory with nothing written and no lock left (a job refused before it began) stays ``failed``."""
    base = dict(path=Path("r"), config={}, overrides=[], records=[{"step": 3}])
    assert report.Run(**base, summary={"status": "running"}, live=True, lock_left=True).status == "running"
    assert report.Run(**base, summary={"status": "running"}, lock_left=True).status == "stopped"
    assert report.Run(**base, summary=None).status == "stopped"  # records, no summary: it had started
    assert report.Run(**{**base, "records": []}, summary=None, lock_left=True).status == "stopped"  # at start-up
    assert report.Run(**{**base, "records": []}, summary=None).status == "failed"
    assert report.Run(**base, summary={"status": "interrupted"}, lock_left=True).status == "interrupted"


# ------------------------------------------------------------------------------------------- a sweep
SHORT = ["trainer.max_steps=4", "trainer.eval_every=4", "trainer.ckpt_every=2", "diag.every=4"]
SWEEP = [o for o in RUN if o.split("=")[0] not in {s.split("=")[0] for s in SHORT}] + SHORT


@pytest.mark.slow
def test_half_finished_sweep_report_names_the_jobs_not_started_and_the_command_that_finishes_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    subdir = "hydra.sweep.subdir=job${hydra.job.num}"  # a hydra override: the finishing command keeps it
    proc = start(tmp_path, "-m", *SWEEP, "seed=0,1,2,3", "hydra.sweep.dir=sweep", subdir, NORMBENCH_TEST_SLOW_LOG="0.3")
    wait_for(lambda: steps(sweep / "job1"), proc, WAIT)  # job 0 done, job 1 under way
    kill(proc)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["job0", "job1"]

    assert report.main([str(sweep), "--no-figures"]) == 0
    md = (sweep / "report.md").read_text()
    rows = all_runs(md)
    assert rows["job0"]["status"] == "completed" and rows["job1"]["status"] == "stopped"
    (line,) = [ln for ln in md.splitlines() if ln.startswith(f"Sweep `{sweep}`")]
    assert "2 of its 4 jobs never started (`seed=2`, `seed=3`)" in line
    command = line.split("with: `", 1)[1].rstrip("`")
    note = capsys.readouterr().err
    assert f"normbench: note: sweep {sweep}: 2 of its 4 jobs never started (seed=2, seed=3); " in note
    assert note.rstrip().endswith(f"finish the sweep with: {command}")
    argv = shlex.split(command)
    assert argv[:5] == ["python", "-m", "normbench", "train", "-m"]
    assert argv[-3:] == [subdir, f"hydra.sweep.dir={sweep}", "trainer.resume=true"] and "seed=0,1,2,3" in argv

    elsewhere = tmp_path / "elsewhere"  # the command names the sweep by its absolute path
    elsewhere.mkdir()
    done = run_cli(argv[3:], cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert [summary(sweep / f"job{n}")["status"] for n in range(4)] == ["completed"] * 4
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["job0", "job1", "job2", "job3"]
    assert report.main([str(sweep), "--no-figures"]) == 0
    assert (
        "Jobs not started" not in (sweep / "report.md").read_text() and "never started" not in capsys.readouterr().err
    )


def test_jobs_not_started_are_matched_by_overrides_over_the_sweepers_params_and_a_resume(tmp_path):
    """An experiment's sweep lies in ``hydra.sweeper.params``; a resumed sweep's jobs add
    ``trainer.resume=true``; a value may be spelled another way (1e-3 and 0.001): still the same job."""
    sweep = tmp_path / "sweep"
    multirun = {
        "hydra": {
            "sweeper": {
                "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                "params": {"optim.lr": "1e-3,1e-2"},
            },
            "overrides": {
                "task": ["+experiment=lr", "seed=0,1", "trainer.resume=true"],
                "hydra": ["hydra.mode=MULTIRUN", "hydra.sweep.dir=elsewhere"],
            },
        }
    }
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    recs = fake_records(1.0)
    jobs = (
        ["+experiment=lr", "optim.lr=0.001", "seed=0"],
        ["+experiment=lr", "optim.lr=1e-3", "seed=1", "trainer.resume=true"],
    )
    for job, overrides in enumerate(jobs):
        make_run(sweep / str(job), overrides, config(), recs, summary_for(recs, "pre_ln", job))
    assert report.main([str(sweep), "--no-figures"]) == 0
    (line,) = [ln for ln in (sweep / "report.md").read_text().splitlines() if ln.startswith("Sweep `")]
    assert "2 of its 4 jobs never started (`optim.lr=0.01 seed=0`, `optim.lr=0.01 seed=1`)" in line
    want = f"python -m normbench train -m +experiment=lr seed=0,1 hydra.sweep.dir={sweep.resolve()} trainer.resume=true"
    assert line.endswith(f"with: `{want}`")


def test_a_finished_or_unknown_sweep_has_no_jobs_missing(tmp_path):
    recs = fake_records(1.0)
    for name, sweeper in (
        ("basic", "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"),
        ("optuna", "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"),
    ):
        sweep = tmp_path / name
        sweep.mkdir()
        task = ["seed=0"] if name == "basic" else ["seed=0", "optim.lr=interval(1e-4,1e-1)"]
        multirun = {"hydra": {"sweeper": {"_target_": sweeper}, "overrides": {"task": task, "hydra": []}}}
        (sweep / "multirun.yaml").write_text(yaml.safe_dump(multirun))
        make_run(sweep / "0", ["seed=0"], config(), recs, summary_for(recs, "pre_ln", 0))
        assert report.main([str(sweep), "--no-figures"]) == 0
        assert "never started" not in (sweep / "report.md").read_text()
