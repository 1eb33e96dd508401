"""The ladders' one loop (reproduce/ladders/rungs.py): a ladder's rule turns the claim's plan into its rungs, and
the loop's dry run calls ``reproduce`` once per rung, in order, with the rung's overrides and directory, after
the rung's line, and writes nothing."""

from __future__ import annotations

from normbench.claims.registry import load_claim
from normbench.reproduce import runner
from normbench.reproduce.ladders import duration, rungs, scale
from normbench.reproduce.plan import start
from normbench.reproduce.request import Request


def _climbed(claim, req, rule, monkeypatch) -> tuple[list, list]:
    """The (overrides, directory) of each ``reproduce`` call of the rule's dry run, and the lines it logged."""
    calls, lines = [], []
    monkeypatch.setattr(runner, "reproduce", lambda c, r, log, base: calls.append((list(r.overrides), r.out)))
    assert rungs.climb(claim, req, rule, log=lines.append) is None
    return calls, lines


def test_a_ladders_dry_run_climbs_the_rungs_its_rule_gives(tmp_path, monkeypatch):
    claim, req = load_claim("rmsnorm_parity"), Request(out=tmp_path, dry_run=True)
    ladder = scale.ladder(claim, req, start(claim, req.scale, req.seeds, [], tmp_path))
    mup = ["model.param=mup", "model.mup_base_width=64", "model.mup_head_dim=16"]
    where = tmp_path / "rmsnorm_parity" / "ladder"
    assert [(list(r.extra), r.where, r.fields) for r in ladder.rungs] == [
        ([], tmp_path, {"d_model": 64, "n_layer": 4}),  # the claim's own sweep
        (["model.d_model=128", "model.n_head=8", *mup], where / "d128-L4-mup", {"d_model": 128, "n_layer": 4}),
        (["model.d_model=256", "model.n_head=16", *mup], where / "d256-L4-mup", {"d_model": 256, "n_layer": 4}),
    ]
    calls, lines = _climbed(claim, req, scale.ladder, monkeypatch)
    assert calls == [(list(r.extra), r.where) for r in ladder.rungs]
    assert lines == [f"normbench: rmsnorm_parity: {r.label}" for r in ladder.rungs]
    assert lines[1] == "normbench: rmsnorm_parity: ladder rung d_model 128, 4 blocks"
    assert not (tmp_path / "rmsnorm_parity").exists()  # a dry run writes no ladder.json


def test_the_branch_ladders_trunk_runs_first_and_its_branches_are_not_seeded_on_a_dry_run(tmp_path, monkeypatch):
    claim, req = load_claim("peri_variance"), Request(out=tmp_path, duration="branch", rungs=(1, 5), dry_run=True)
    ladder = duration.branched(claim, req, start(claim, req.scale, req.seeds, [], tmp_path))
    trunk, branch = ladder.rungs
    where = tmp_path / "peri_variance" / "duration" / "branch"
    assert (trunk.where, trunk.last, trunk.before) == (where / "tpp5", True, None)
    assert trunk.extra[:3] == ("sched=wsd", "sched.decay_fraction=0.2", "sched.warmup_steps=22")
    assert trunk.extra[3:] == ("trainer.max_steps=1120", "trainer.save_at=[179]")
    assert (branch.where, branch.last, branch.before is not None) == (where / "tpp1", False, True)
    assert branch.extra[-2:] == ("trainer.max_steps=224", "trainer.resume_allow_changed=[trainer.max_steps]")
    monkeypatch.setattr(duration, "seed_branches", lambda *a: 1 / 0)  # a dry run copies no checkpoint
    calls, lines = _climbed(claim, req, duration.branched, monkeypatch)
    assert calls == [(list(trunk.extra), trunk.where), (list(branch.extra), branch.where)]
    assert lines[1] == "normbench: peri_variance: duration rung 1 tokens per parameter: branches from step 179"
