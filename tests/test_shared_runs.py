"""Runs shared across claims (reproduce/store.py): which settings leave a run's trajectory alone, proved
by training, and the store that trains each distinct run once."""

from __future__ import annotations

import pytest
import torch

from normbench.reproduce.request import Request
from normbench.run.metrics import read_jsonl

from conftest import run_cli

BASE = ["model=tiny", "trainer.max_steps=12", "trainer.batch_size=4", "trainer.eval_batches=2", "device=cpu", "seed=1"]
# what differs between the claims asking for one training: diagnostics (switches, cadence, batch) and bookkeeping
VARIANTS = {
    "off": ["diag=off", "trainer.log_every=1", "trainer.eval_every=12"],
    "full": [
        "diag=full",
        "diag.every=1",
        "diag.batch=3",
        "trainer.log_every=2",
        "trainer.eval_every=3",
        "trainer.ckpt_every=5",
    ],
    "default": ["diag=default", "diag.every=4", "trainer.log_every=1", "trainer.eval_every=4", "logger=jsonl"],
}


@pytest.mark.slow
def test_diagnostics_and_bookkeeping_leave_the_trajectory_bit_for_bit(tmp_path):
    """The same training with no diagnostics, every diagnostic at every step, or the default ones every 4
    steps (and other log, eval and checkpoint cadences): the same training losses at every step two runs
    both log, the same val losses where both evaluate, and the same final parameters, to the last bit.
    So :data:`normbench.reproduce.store.TRAJECTORY_FREE` may differ between the claims one run serves."""
    from normbench.reproduce.store import TRAJECTORY_FREE

    for name, extra in VARIANTS.items():
        run_cli(["train", *BASE, *extra, f"hydra.run.dir={tmp_path / name}"], tmp_path, check=True)
    records = {n: read_jsonl(tmp_path / n / "metrics.jsonl") for n in VARIANTS}
    losses = {n: {r["step"]: r["loss"] for r in rs if "loss" in r} for n, rs in records.items()}
    vals = {n: {r["step"]: r["val_loss"] for r in rs if r.get("val_loss") is not None} for n, rs in records.items()}
    weights = {n: torch.load(tmp_path / n / "checkpoints" / "last.pt", weights_only=False)["model"] for n in VARIANTS}
    assert any("attn_logit_max" in r for r in records["full"]) and not any("var_resid" in r for r in records["off"])
    for n in ("full", "default"):
        common = losses["off"].keys() & losses[n].keys()
        assert len(common) >= 6 and all(losses["off"][s] == losses[n][s] for s in common), n
        assert vals["off"][12] == vals[n][12], n
        assert weights["off"].keys() == weights[n].keys()
        assert all(torch.equal(weights["off"][k], weights[n][k]) for k in weights["off"]), n
    assert vals["full"][3] != vals["full"][12]  # the comparison has teeth: the model moved between evals
    for extra in VARIANTS.values():  # every key varied here is one the store lets differ
        keys = {o.split("=", 1)[0] for o in extra}
        assert all(any(k == f or k.startswith(f + ".") for f in TRAJECTORY_FREE) for k in keys), keys


def _claim(directory, cid, sweeps, fixed, tests=None, seeds=2):
    import yaml

    from normbench.claims.registry import load_claim

    key = next(iter(sweeps[0]))
    test = {
        "name": "t",
        "kind": "difference",
        "metric": "best_val_loss",
        "group": {key: sweeps[0][key][1]},
        "baseline": {key: sweeps[0][key][0]},
        "threshold": 0.05,
    }
    raw = {
        "claim": "made up",
        "paper": "nobody",
        "tests": tests or [test],
        "scales": {"cpu": {"seeds": seeds, "fixed": fixed, "sweeps": sweeps}},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{cid}.yaml").write_text(yaml.safe_dump(raw))
    return load_claim(cid, directory)


def _finish(run_dir, diag="default", loss=2.0):
    """A finished run as the trainer leaves it (its config's diag switches, a summary)."""
    import json

    import yaml

    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"diag": {"name": diag}}))
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "best_val_loss": loss}))


COMMON = ["model=tiny", "trainer.max_steps=6"]


def test_a_run_of_one_claim_serves_another_and_only_the_rest_is_trained(tmp_path):
    """Claim A (norms at Pre-LN) and claim B (placements at LayerNorm) both train Pre-LN + LayerNorm: once
    A's runs exist, B's are links to them, and B's sweep trains only its Peri-LN job, into its own dirs."""
    from normbench.analysis.loading import find_runs
    from normbench.reproduce import store
    from normbench.reproduce.plan import build

    a = _claim(tmp_path / "c", "a", [{"norm": ["layernorm", "rmsnorm"]}], [*COMMON, "arch=pre_ln"])
    b = _claim(tmp_path / "c", "b", [{"arch": ["pre_ln", "peri_ln"]}], [*COMMON, "norm=layernorm"])
    out, quiet = tmp_path / "out", lambda *_: None
    pa, pb = build(a, "cpu", None, [], out, quiet), build(b, "cpu", None, [], out, quiet)
    addr = lambda p: [x for x, *_ in store._runs(p)]
    assert addr(pa)[:2] == addr(pb)[:2] and not set(addr(pa)[2:]) & set(addr(pb)[2:])  # seeds 0, 1 of one job
    for run in pa.expected[0]:
        _finish(pa.run_dir(run, 0))
    store.register(pa)
    assert len(list((out / store.STORE).iterdir())) == 4
    assert store.serve(pb, quiet) == 2 and store.shared_dirs(pb, 0)
    served = pb.run_dir({"arch": "pre_ln", "seed": "0"}, 0)
    assert served.is_symlink() and served.resolve() == pa.run_dir({"norm": "layernorm", "seed": "0"}, 0).resolve()
    (argv,) = store.missing_argvs(pb, 0)  # the Peri-LN job alone, both seeds, the grid's dirs and hash
    assert "arch=peri_ln" in argv and "seed=0,1" in argv and not any(a.startswith("arch=pre_ln") for a in argv)
    assert [a for a in argv if a.startswith("hydra.sweep.dir=")] == [
        a for a in pb.argvs[0] if a.startswith("hydra.sweep.dir=")
    ]
    assert len(find_runs(pb.root)) == 2 and store.serve(pb, quiet) == 0  # linked once
    # the whole output dir: each run once, under its own claim's path rather than the store's link
    assert sorted(r.path.relative_to(out).parts[0] for r in find_runs(out)) == ["a"] * 4

    # a claim that needs more diagnostics than a run recorded is not served by it; nor a timed claim by others'
    c = _claim(tmp_path / "c", "c", [{"arch": ["pre_ln", "peri_ln"]}], [*COMMON, "norm=layernorm", "diag=full"])
    assert store.serve(build(c, "cpu", None, [], out, quiet), quiet) == 0
    timed = {
        "name": "t",
        "kind": "difference",
        "metric": "tokens_per_s",
        "group": {"arch": "peri_ln"},
        "baseline": {"arch": "pre_ln"},
        "threshold": 0.05,
    }
    fixed = [*COMMON, "norm=layernorm", "diag=off"]
    d = _claim(tmp_path / "c", "d", [{"arch": ["pre_ln", "peri_ln"]}], fixed, [timed])
    assert store.serve(build(d, "cpu", None, [], out, quiet), quiet) == 0  # diagnostics cost time: not served
    e = _claim(tmp_path / "c", "e", [{"arch": ["pre_ln", "peri_ln"]}], fixed)
    assert store.serve(build(e, "cpu", None, [], out, quiet), quiet) == 2  # more diagnostics than it reads: served


def test_the_address_leaves_out_what_the_trajectory_ignores_and_keeps_what_is_measured(tmp_path):
    from normbench.config.files import compose_config
    from normbench.reproduce.store import address

    base = address(compose_config(COMMON), 0)
    assert address(compose_config([*COMMON, "diag=full", "trainer.ckpt_every=7", "logger=jsonl"]), 0) == base
    for other in ("diag.every=10", "trainer.eval_every=7", "optim.lr=1e-2", "compile=true"):
        assert address(compose_config([*COMMON, other]), 0) != base, other
    assert address(compose_config(COMMON), 1) != base


def test_reproduce_all_dry_run_counts_total_distinct_runs_and_hours(tmp_path, capsys, monkeypatch):
    from normbench.cli import main
    from normbench.reproduce import estimate

    monkeypatch.setattr(estimate, "cpu_rate", lambda: 4.5e10)
    ids = ["peri_variance", "rmsnorm_parity", "powernorm_gap"]  # Pre-LN + LayerNorm at 4 blocks in all three
    assert main(["reproduce", *ids, f"out={tmp_path}", "--dry-run"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    import re

    m = re.match(
        r"normbench: (.+): (\d+) runs, (\d+) distinct \((\d+) shared between claims; distinct only by "
        r"their records' cadence: (\d+)\), (\d+) to train: ",
        line,
    )
    assert m and m.group(1) == " ".join(ids), line
    total, distinct, shared, cadence, todo = map(int, m.groups()[1:])
    assert total == 21 and shared == 6 and distinct == todo == 15  # 3 seeds x (2 + 2 + 3 jobs); the baseline once
    assert cadence == 0  # the three record their shared baseline at one cadence
    hours = float(re.search(r"to train: ([\d.]+) CPU-hours \(one thread a run\)", line).group(1))
    assert hours > 0 and "cores at jobs=" in line and not any(tmp_path.iterdir())


def test_the_tally_counts_runs_that_differ_only_in_their_records_cadence(tmp_path):
    """Two claims train Pre-LN + LayerNorm, one evaluating every 2 steps and one every 3: two distinct runs
    per seed (the best val loss is read at each one's evaluations), one trajectory; a third claim with
    another LR is a trajectory of its own."""
    from normbench.reproduce import store
    from normbench.reproduce.plan import build

    out, quiet, fixed = tmp_path / "out", lambda *_: None, [*COMMON, "norm=layernorm"]
    claims = [
        _claim(tmp_path / "c", "a", [{"arch": ["pre_ln", "peri_ln"]}], [*fixed, "trainer.eval_every=2"]),
        _claim(tmp_path / "c", "b", [{"arch": ["pre_ln", "post_ln"]}], [*fixed, "trainer.eval_every=3"]),
        _claim(tmp_path / "c", "c", [{"arch": ["pre_ln", "post_ln"]}], [*fixed, "optim.lr=4e-3"]),
    ]
    tally = [t for c in claims for t in store.estimates(build(c, "cpu", None, [], out, quiet))]
    assert len(tally) == 12 and len({t[0] for t in tally}) == 12  # no run shared: every address its own
    assert len({t[3] for t in tally}) == 10  # Pre-LN's two seeds are one trajectory each in a and b
    assert "12 runs, 12 distinct (0 shared between claims; distinct only by their records' cadence: 2)" in (
        store.tally_line(tally)
    )


@pytest.mark.slow
def test_every_claim_records_a_shared_trajectory_at_one_cadence(tmp_path, capsys, monkeypatch):
    """The whole suite's dry run: no two of its distinct runs train the same steps at different cadences
    (a claim file that set its own eval or diagnostics cadence would make one; align it to share the run)."""
    from normbench.cli import main
    from normbench.reproduce import estimate

    monkeypatch.setattr(estimate, "cpu_rate", lambda: 4.5e10)
    assert main(["reproduce", "all", f"out={tmp_path}", "--dry-run"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("normbench: all: ") and "distinct only by their records' cadence: 0)" in line, line


@pytest.mark.slow
def test_two_claims_train_their_shared_job_once(tmp_path, monkeypatch):
    """End to end on tiny runs: A trains its 4 runs; B (its Pre-LN + LayerNorm job is A's LayerNorm one)
    trains only its 2 Peri-LN runs, is judged on 4, and a second call of B trains nothing."""
    from normbench.reproduce import runner

    fixed = [
        *COMMON,
        "trainer.eval_every=3",
        "trainer.batch_size=4",
        "trainer.eval_batches=2",
        "diag=off",
        "device=cpu",
    ]
    a = _claim(tmp_path / "c", "a", [{"norm": ["layernorm", "rmsnorm"]}], [*fixed, "arch=pre_ln"])
    b = _claim(tmp_path / "c", "b", [{"arch": ["pre_ln", "peri_ln"]}], [*fixed, "norm=layernorm"])
    trained, real = [], runner.train
    monkeypatch.setattr(runner, "train", lambda argv: trained.append(argv) or real(argv))
    out, quiet = tmp_path / "out", lambda *_: None
    runner.reproduce(a, Request(out=out, min_seeds=2), log=quiet)
    res = runner.reproduce(b, Request(out=out, min_seeds=2), log=quiet)
    assert len(trained) == 2 and "arch=peri_ln" in trained[1] and "seed=0,1" in trained[1]
    assert res["n_runs"] == 4 and all(len(g["values"]) == 2 for g in res["groups"].values())
    monkeypatch.setattr(runner, "train", lambda argv: pytest.fail(f"trained again: {argv}"))
    assert runner.reproduce(b, Request(out=out, min_seeds=2), log=quiet)["effect"] == res["effect"]


def test_find_runs_follows_links_once_and_never_loops(tmp_path):
    """A link to an ancestor is not walked again; a run reached by a link and by its own path is one run."""
    import os

    from normbench.analysis.loading import find_runs

    _finish(tmp_path / "claim" / "run")
    os.symlink(tmp_path, tmp_path / "claim" / "loop")
    (tmp_path / "other").mkdir()
    os.symlink(tmp_path / "claim" / "run", tmp_path / "other" / "linked")
    assert [r.path for r in find_runs(tmp_path)] == [tmp_path / "claim" / "run"]
    assert [r.path for r in find_runs(tmp_path / "other")] == [tmp_path / "other" / "linked"]
