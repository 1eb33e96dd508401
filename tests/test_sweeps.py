"""Sweeps: ready ablations, glob sweeps, sweep directories, launchers and the optuna sweeper.

The 4-job multirun that the report reads (and a partly failed one) is in test_report.py.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from omegaconf import OmegaConf

from normbench.cli.overrides import expand_sweep, prevalidate
from normbench.config import files
from normbench.config.schema import register_configs
from normbench.run.sweeps import claim
from normbench.validation import ARCHS, NORMS

from conftest import OFFLINE_ENV, REPO, TINY, run_cli

EXPERIMENTS = sorted(p.stem for p in (files.config_dir() / "experiment").glob("*.yaml"))
FAST = [*TINY, "trainer.max_steps=4", "trainer.log_every=2", "trainer.eval_every=2", "diag.every=2"]


def compose_with_hydra(overrides: list[str]):
    """The composed config including its ``hydra`` node (sweeper, launcher, mode)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(files.config_dir()), version_base="1.3", job_name="train"):
            return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def header(name: str) -> str:
    """The leading comment block of an experiment file, as one line."""
    lines = []
    for line in (files.config_dir() / "experiment" / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def gpu_overrides(text: str) -> list[str]:
    """The ``key=value`` words right after "GPU size:" in an experiment's comment."""
    out = []
    for word in text.split("GPU size:", 1)[1].split():
        if "=" not in word:
            break
        out.append(word.rstrip(",.;"))
    return out


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_ready_ablation_composes_and_states_its_question(name):
    text = header(name)
    assert text.startswith("@package _global_ Question: "), f"{name}: first comment line must ask the question"
    assert "CPU default: model=tiny" in text and "GPU size:" in text
    cfg = compose_with_hydra([f"experiment={name}"])
    assert cfg.hydra.mode.name == "MULTIRUN"  # `train experiment=X` is a sweep without -m
    assert cfg.model.name == "tiny" and cfg.trainer.max_steps <= 200  # CPU default: minutes
    params = dict(cfg.hydra.sweeper.params)
    assert len(params) >= 1
    if name == "lr_optuna":
        assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and "interval" in params["optim.lr"]
        assert cfg.hydra.sweeper.n_trials <= 20
    else:
        jobs = math.prod(len(str(v).split(",")) for v in params.values())
        stated = re.search(r"(\d+) jobs", text)
        assert stated is None or int(stated.group(1)) == jobs, f"{name}: the comment says {stated.group(0)}"
    # every sweep value composes and validates (each value once), and so does the documented GPU size
    prevalidate([f"experiment={name}", *(f"{k}={v}" for k, v in params.items())])
    gpu = gpu_overrides(text)
    assert any(o.startswith("model=") for o in gpu), f"{name}: the GPU size override names a model"
    prevalidate([f"experiment={name}", *gpu])


def test_glob_sweeps_see_only_the_options():
    """The schema is top-level (normbench_schema), not in a group: glob(*) finds exactly the options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    register_configs()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(files.config_dir())))
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(["arch=glob(*)", "norm=glob(*)"])
    expanded = {o.key_or_group: sorted(o.sweep_string_iterator()) for o in parsed}
    assert expanded == {"arch": sorted(ARCHS), "norm": sorted(NORMS)}
    assert len(expanded["arch"]) == len(ARCHS)
    # the CLI's pre-validation expands glob() the same way, and checks every architecture once
    variants = expand_sweep(["arch=glob(*)", "model=tiny"])
    assert sorted(v[0] for v in variants) == [f"arch={a}" for a in sorted(ARCHS)]
    prevalidate(["arch=glob(*)", "norm=choice(layernorm,rmsnorm)", "model=tiny"])


def test_shipped_launcher_configs():
    slurm = compose_with_hydra(["hydra/launcher=slurm"]).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher")
    for key in ("nodes", "gpus_per_node", "tasks_per_node", "timeout_min", "partition", "cpus_per_task", "mem_gb"):
        assert key in slurm, key
    assert slurm.tasks_per_node == 1 and slurm.gpus_per_node == 1
    joblib = compose_with_hydra(["hydra/launcher=joblib"]).hydra.launcher
    assert joblib._target_.endswith("JoblibLauncher")


def test_default_sweep_dir_names():
    hc = compose_with_hydra([]).hydra
    raw = OmegaConf.to_container(hc.sweep, resolve=False)
    assert raw["dir"] == "outputs/multirun/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"  # microseconds
    assert raw["subdir"] == "${hydra.job.num}_${nb_job_dir:${hydra.job.override_dirname}}"  # flat (rundir)
    assert hc.callbacks.unique_sweep_dir._target_ == "normbench.run.sweeps.UniqueSweepDir"


def test_claim_takes_the_next_free_name(tmp_path):
    want = tmp_path / "multirun" / "12-00-00-000001"
    assert claim(want) == want and want.is_dir()
    assert claim(want) == tmp_path / "multirun" / "12-00-00-000001-1"
    assert claim(want) == tmp_path / "multirun" / "12-00-00-000001-2"


@pytest.mark.slow
def test_simultaneous_sweeps_never_share_a_dir(tmp_path):
    """Two sweeps whose timestamp resolves to the same name (forced here) get two directories."""
    same = "hydra.sweep.dir=out/${now:%Y}-same"  # the same name in both processes
    cmd = [sys.executable, "-m", "normbench", "train", "-m", same, "seed=0", *FAST, "trainer.max_steps=2"]
    env = {**os.environ, **OFFLINE_ENV}
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(dirs) == 2 and dirs[1] == dirs[0] + "-1"
    for d in dirs:
        (job,) = [p for p in (tmp_path / "out" / d).iterdir() if p.is_dir()]
        assert job.name.startswith("0_") and (tmp_path / "out" / d / "multirun.yaml").exists()
        hydra_yaml = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())
        assert hydra_yaml["hydra"]["runtime"]["output_dir"] == str(job.resolve())
        assert '"status": "completed"' in (job / "summary.json").read_text()


def _statuses(sweep):
    return {
        p.name.split("_", 1)[0]: yaml.safe_load((p / "summary.json").read_text())["status"]
        for p in sweep.iterdir()
        if (p / "summary.json").exists()
    }


@pytest.mark.slow
def test_joblib_launcher(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [
            "train",
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "arch=pre_ln,post_ln",
            *FAST,
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        check=True,
    )
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    assert _statuses(sweep) == {"0": "completed", "1": "completed"}


@pytest.mark.slow
def test_submitit_local_launcher(tmp_path):
    """The plugin behind hydra/launcher=slurm, run locally; also the sweep-dir guard across the
    launcher's re-composition (jobs run in their own processes)."""
    (tmp_path / "out" / f"{datetime.date.today():%Y}-x").mkdir(parents=True)  # taken
    args = [
        "train",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        "arch=pre_ln,post_ln",
        *FAST,
        "hydra.sweep.dir=out/${now:%Y}-x",
    ]
    proc = run_cli(args, cwd=tmp_path, check=True)
    sweeps = sorted((tmp_path / "out").iterdir())
    assert [p.name.endswith("-x-1") for p in sweeps] == [False, True], proc.stdout
    assert _statuses(sweeps[1]) == {"0": "completed", "1": "completed"}
    assert list((sweeps[1] / ".submitit").glob("*/*_log.out"))  # each job ran as a submitit job


@pytest.mark.slow
def test_optuna_search_survives_a_diverged_trial(tmp_path):
    """A diverged trial scores 1e6 (not a crash); the study goes on and picks the completed one."""
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [
            "train",
            "experiment=lr_optuna",
            "optim.lr=choice(1e-3,50.0)",
            "hydra.sweeper.n_trials=3",
            *FAST,
            "trainer.max_steps=6",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        check=True,
    )
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"optim.lr": 0.001}
    summaries = {}
    for job in sweep.iterdir():
        if (job / "summary.json").exists():
            s = yaml.safe_load((job / "summary.json").read_text())
            summaries.setdefault(s["status"], []).append(s)
    assert set(summaries) == {"completed", "diverged"}, proc.stdout
    assert results["best_value"] == pytest.approx(summaries["completed"][0]["best_val_loss"])
    assert (REPO / "conf" / "experiment" / "lr_optuna.yaml").exists()


@pytest.mark.parametrize(
    "overrides,jobs",
    [
        (["arch=pre_ln,post_ln,peri_ln", "norm=layernorm,rmsnorm", "seed=0,1"], 12),
        (["experiment=placement"], 42),  # docs/ablation.md's table: 7 placements x 2 norms x 3 seeds
        (["experiment=norm_layer"], 20),
        (["experiment=placement", "seed=0"], 14),  # an override on the command line replaces the sweeper's
        (["experiment=lr_optuna"], 12),  # Optuna: its n_trials
        (["seed=range(0,3)"], 3),
        (["optim.lr=interval(1e-4,1e-2)"], None),  # a continuous range: no count
    ],
)
def test_the_sweep_counts_its_jobs(overrides, jobs):
    from omegaconf import open_dict, read_write

    from normbench.cli.progress import planned_jobs

    # composed as Hydra's multirun sees it: the experiment's sweeper, the command line's overrides as the task
    cfg = compose_with_hydra([o for o in overrides if o.startswith("experiment=")])
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.overrides.task = overrides
    assert planned_jobs(cfg) == jobs


def test_a_sweep_whose_jobs_ran_in_worker_processes_ends_with_its_planned_count(tmp_path, capsys):
    """joblib runs on_job_start/end in its workers: the sweep's own process saw no job, and says the planned count."""
    from normbench.cli.progress import SweepProgress

    progress = SweepProgress()
    progress.start, progress.total = time.monotonic(), 9
    progress.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert "sweep finished: 9 jobs in " in capsys.readouterr().out
    progress.total = None  # a continuous range: no count to give
    progress.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert "sweep finished: ? jobs in " in capsys.readouterr().out


@pytest.mark.slow
def test_sweep_jobs_say_k_of_n_and_the_sweep_ends_with_its_leaderboard(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        ["train", "-m", "norm=layernorm,rmsnorm", "seed=0", *FAST, "trainer.max_steps=2", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        check=True,
    )
    out = proc.stdout
    assert "sweep job 1/2: norm=layernorm seed=0" in out
    assert re.search(r"sweep job 2/2 \(1 done in \dm\d\ds; sweep ETA \dm\d\ds\): norm=rmsnorm seed=0", out), out
    end = out.split("sweep finished: 2 jobs in ")[1]
    assert "best val loss, top 2 of 2 groups, best first" in end and "1. norm=" in end and "2. norm=" in end
    # two steps learn nothing: the verdict box's line says no verdict can be made, not "no difference"
    assert "No verdict can be made: every run got stuck or diverged (2 stuck)" in end
    assert end.index("No verdict") < end.index("sweep directory:")  # before the closing sweep-directory line
