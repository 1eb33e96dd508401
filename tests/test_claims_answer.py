"""The one-table answer at the top of docs/claims.md (issue 52): one record per claim in docs/verdicts/, the
table between the page's answer markers equal to what ``scripts/claims_table.py answer`` draws from them
(so neither is edited without the other), and ``record`` turning a verdict.json as ``reproduce`` writes it
into a record the table renders, so the next verdict is copied rather than transcribed by hand."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from normbench.claims import verdict as V
from normbench.claims.registry import claim_ids, load_claim

from conftest import REPO

VERDICTS = REPO / "docs" / "verdicts"
PAGE = REPO / "docs" / "claims.md"


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("claims_table", REPO / "scripts" / "claims_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_record_per_claim_with_its_keys_and_a_verdict_its_tests_give(table):
    """Every conf/claims/*.yaml has exactly one record, named by its id, with the keys the table reads; its
    verdict is one of the rule's three and the one its judged tests combine to (a transcription check)."""
    assert sorted(p.stem for p in VERDICTS.glob("*.json")) == claim_ids()
    for cid in claim_ids():
        rec = json.loads((VERDICTS / f"{cid}.json").read_text())
        assert rec["claim"] == cid
        assert table.check_record(rec) == []
        assert rec["verdict"] in (V.HOLDS, V.FAILS, V.INCONCLUSIVE)
        assert rec["paper"] == load_claim(cid).paper
        judged = [t["verdict"] for t in rec["tests"] if not t.get("informative")]
        assert V.combine(judged) == rec["verdict"], cid
        assert set(rec.get("ladders") or {}) <= {"lr", "duration", "width"}
        assert rec["source"].startswith(("transcribed from docs/claims.md", "copied from"))


def test_the_page_holds_the_table_the_records_give(table, tmp_path):
    """docs/claims.md's answer is what ``answer`` draws from docs/verdicts, row for row in conf/claims order;
    a record changed without redrawing the page no longer matches."""
    lines = table.answer_lines(VERDICTS)
    assert table.answer_text(PAGE) == "\n".join(lines), (
        "docs/claims.md's answer differs from docs/verdicts: "
        "python scripts/claims_table.py answer docs/verdicts --write docs/claims.md"
    )
    rows = [line for line in lines if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == claim_ids()
    shutil.copytree(VERDICTS, tmp_path / "verdicts")
    edited = json.loads((tmp_path / "verdicts" / "crmsnorm_parity.json").read_text())
    edited["tests"][0]["effect"] = 0.0111
    (tmp_path / "verdicts" / "crmsnorm_parity.json").write_text(json.dumps(edited))
    assert table.answer_text(PAGE) != "\n".join(table.answer_lines(tmp_path / "verdicts"))


def _test(name, verdict, effect, ci, ratio=None, kind="difference", interval="paired"):
    """A test as measure.judge_test writes it into verdict.json (the keys the record reads, and some it does not)."""
    return {
        "name": name,
        "verdict": verdict,
        "effect": effect,
        "ci": ci,
        "interval": interval,
        "kind": kind,
        "metric": "best_val_loss",
        "transform": "log" if ratio else None,
        "ratio": ratio,
        "threshold": 0.02,
        "direction": "lower",
        "informative": False,
        "target": None,
        "n_seeds": 3,
        "reason": None,
        "groups": {
            "norm=a": {"values": [1.0, 1.1, 1.2], "mean": 1.1, "runs": 3, "outcomes": {"learned": 3}, "init_std": 0.069}
        },
    }


def _verdict(**extra) -> dict:
    """A made-up verdict.json in runner.reproduce's structure."""
    return {
        "claim": "madeup",
        "statement": "A is lower than B",
        "paper": "Doe et al. 2030, Madeup, arXiv:3001.00001 (Fig. 2)",
        "verdict": V.FAILS,
        "scale": "cpu",
        "n_seeds": 3,
        "reason": "second: on the other side",
        "tests": [
            _test("first", V.HOLDS, -0.52, [-0.7, -0.34], ratio=0.595),
            _test("second", V.FAILS, 0.0421, [0.0113, 0.0729]),
        ],
        "length": {"tokens_per_param": 20, "steps": 4480, "reference_params": 229_000, "reached": [19.6, 20.0]},
        "mode": {"precision": "bf16", "attn_fp32": True, "compile": True, "cpu_mode": "bf16", "native_bf16": True},
        "commit": "abc1234",
        "settings": ["model=tiny", "optim.lr=auto", "compile=true"],
        "n_runs": 6,
        "run_time_s": 1200.0,
        **extra,
    }


def test_a_verdict_json_becomes_a_record_the_table_renders(table, tmp_path, capsys):
    """``record --into`` writes the claim's record (keeping the ladders of the one it replaces); its row names
    where it was measured and the deciding test's effect and interval, not the test that held."""
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(_verdict()))
    into = tmp_path / "verdicts"
    into.mkdir()
    (into / "madeup.json").write_text(json.dumps({"claim": "madeup", "ladders": {"lr": "0.9 tpp: grows with the LR"}}))
    assert table.main(["record", str(path), "--into", str(into)]) == 0
    rec = json.loads((into / "madeup.json").read_text())
    assert table.check_record(rec) == []
    assert rec["where"] == "20 tokens per parameter, recipe's LR, claims' mode (bf16 with fp32 attention, compiled)"
    assert "pending" not in rec and rec["ladders"] == {"lr": "0.9 tpp: grows with the LR"}
    assert rec["tests"][1] == {
        "name": "second",
        "verdict": V.FAILS,
        "effect": 0.0421,
        "ci": [0.0113, 0.0729],
        "interval": "paired",
        "seeds": 3,
        "steps": 4480,
        "commit": "abc1234",
        "informative": False,
    }
    assert "abc1234" in rec["source"] and str(path) in rec["source"]
    capsys.readouterr()
    assert table.main(["record", str(path)]) == 0  # without --into: the record on stdout, no ladders
    assert json.loads(capsys.readouterr().out)["tests"] == rec["tests"]
    assert table.main(["record", str(path), "--ran-on", "a worktree at abc1234, Zen 4, bf16 mode"]) == 0
    source = json.loads(capsys.readouterr().out)["source"]
    assert source.startswith(f"copied from {path} (a worktree at abc1234, Zen 4, bf16 mode) by ")
    assert table.main(["record"]) == 2  # a usage error names what is missing, as a return code
    assert "the following arguments are required: verdict" in capsys.readouterr().err
    lines = table.answer_lines(into, ids=[])
    row = next(line for line in lines if line.startswith("| `madeup`"))
    assert row == (
        "| `madeup` | Doe et al. 2030, arXiv:3001.00001 | **DOES NOT HOLD**, 20 tokens per parameter, recipe's LR, "
        "claims' mode (bf16 with fp32 attention, compiled) | second: 0.0421 [0.0113, 0.0729] | "
        "LR ladder: 0.9 tpp: grows with the LR |"
    )


def test_a_quick_verdict_is_marked_pending_and_a_grid_test_has_no_interval(table, tmp_path):
    """A verdict short of 20 tokens per parameter is the claim's latest, pending the papers' length; a
    largest-LR test's effect is grid steps, with no interval; holding, every judged test decides."""
    lr_test = _test("largest LR", V.HOLDS, 1, None, kind="largest_lr", interval=None)
    quick = _verdict(
        verdict=V.HOLDS,
        tests=[lr_test, _test("loss", V.HOLDS, -0.2, [-0.3, -0.1])],
        length={"tokens_per_param": None, "steps": 200},
        scale="quick",
        mode=None,
        settings=["model=tiny"],
    )
    (tmp_path / "verdict.json").write_text(json.dumps(quick))
    rec = table.record(tmp_path / "verdict.json")
    assert rec["pending"] == table.PENDING and rec["tests"][0]["interval"] == "grid"
    assert rec["where"] == "200 steps (scale=quick), the claim's own LR or grid"
    row = table.answer_row(rec)
    assert "**HOLDS**, 200 steps (scale=quick), the claim's own LR or grid; *pending*: 20 tokens per parameter" in row
    assert "largest LR: +1 (LR grid steps; no interval)<br>loss: -0.2 [-0.3, -0.1] |" in row
    assert row.endswith("| no ladder run |")


def test_the_table_goes_between_the_markers_and_nowhere_else(table, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# T\n\nintro\n\n{table.START}\nold\n{table.END}\n\n## Next\n")
    table.write_answer(page, ["| a |", "", "note"])
    assert page.read_text() == f"# T\n\nintro\n\n{table.START}\n| a |\n\nnote\n{table.END}\n\n## Next\n"
    assert table.answer_text(page) == "| a |\n\nnote"
    (tmp_path / "bare.md").write_text("# T\n")
    with pytest.raises(ValueError, match="markers"):
        table.write_answer(tmp_path / "bare.md", ["x"])
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "x.json").write_text(json.dumps({"claim": "x", "verdict": "MAYBE"}))
    with pytest.raises(ValueError, match="verdict 'MAYBE'"):
        table.load_records(tmp_path / "v")
