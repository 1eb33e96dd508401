"""The one reader of a run directory (normbench.run.reader.RunReader): what it gives back from whole,
damaged and old run directories, and the bookkeeping keys listed once."""

from __future__ import annotations

import json

import yaml

from normbench.claims.registry import claim_ids, load_claim
from normbench.reproduce import runner
from normbench.run.reader import RunReader
from normbench.run.resume import BOOKKEEPING_KEYS, FREE_KEYS
from normbench.run.rundir import UNREADABLE, RunDir


def test_a_whole_run_reads_back(tmp_path):
    rd = RunDir(tmp_path)
    rd.hydra_dir.mkdir()
    rd.config_path.write_text(yaml.safe_dump({"seed": 3, "arch": {"name": "post_ln"}}))
    rd.overrides_path.write_text(yaml.safe_dump(["arch=post_ln", "seed=3"]))
    rd.metrics_path.write_text(json.dumps({"step": 1, "loss": 5.0}) + '\n{"step": "x"}\n{"step": 2, "lo')
    rd.write_summary({"status": "completed", "step": 1})
    rd.layer_skip_path.write_text(json.dumps({"base": 1.0, "skipped": [2.0], "increase": [1.0]}))
    run = RunReader(tmp_path)
    assert run.config == {"seed": 3, "arch": {"name": "post_ln"}}
    assert run.overrides == ["arch=post_ln", "seed=3"]
    assert run.metrics == [{"step": 1, "loss": 5.0}], "torn lines and records without an integer step are left out"
    assert run.summary == {"status": "completed", "step": 1}
    assert run.layer_skip() == {"base": 1.0, "skipped": [2.0], "increase": [1.0]}
    assert not run.live and run.checkpoint_path == tmp_path / "checkpoints" / "last.pt"


def test_a_damaged_or_empty_run_directory_never_raises(tmp_path):
    run = RunReader(tmp_path)
    assert (run.config, run.overrides, run.summary, run.metrics, run.layer_skip()) == ({}, [], None, [], None)
    assert run.typed_config() is None
    rd = RunDir(tmp_path)
    rd.hydra_dir.mkdir()
    rd.config_path.write_text("seed: [unclosed\n")
    rd.overrides_path.write_text("just a string\n")
    rd.summary_path.write_text("{not json")
    rd.layer_skip_path.write_text("{")
    run = RunReader(tmp_path)
    assert (run.config, run.overrides, run.layer_skip()) == ({}, [], None)
    assert run.summary["status"] == UNREADABLE


def test_typed_config_fills_keys_added_since_and_falls_back_to_the_checkpoints_copy(tmp_path):
    old = tmp_path / "old"
    RunDir(old).hydra_dir.mkdir(parents=True)
    RunDir(old).config_path.write_text(yaml.safe_dump({"seed": 5, "model": {"n_layer": 3}}))
    cfg = RunReader(old).typed_config()
    assert cfg.seed == 5 and cfg.model.n_layer == 3
    assert cfg.arch.attn_gate == "none", "a key the old run never wrote gets the schema's default"
    bare = RunReader(tmp_path / "bare").typed_config(fallback={"seed": 7, "model.n_layer": 2})
    assert bare.seed == 7 and bare.model.n_layer == 2


def test_the_bookkeeping_keys_are_the_one_list_everyone_uses(tmp_path):
    assert set(BOOKKEEPING_KEYS) <= set(FREE_KEYS), "bookkeeping keys may change on resume"
    claim = load_claim(claim_ids()[0])
    _, argvs, _ = runner.plan(claim, "cpu", 1, [], tmp_path)
    exclude = next(a for a in argvs[0] if a.startswith("hydra.job.config.override_dirname.exclude_keys="))
    assert exclude.split("=", 1)[1].strip("[]").split(",")[: len(BOOKKEEPING_KEYS)] == list(BOOKKEEPING_KEYS)
