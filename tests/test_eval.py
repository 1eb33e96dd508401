"""``normbench eval``: lm-evaluation-harness over normbench's own model, checked against the harness's HF model.

On the local tasks of tests/data/eval_tasks (offline, through --include-path: a 10-question multiple-choice
task whose longest prompts exceed the block size, and a perplexity task whose every document is conditioned
on the EOS), a tiny trained run scored by ``normbench eval`` must give the same acc and acc_norm as
lm-eval's ``HFLM`` on ``normbench export`` of the run, and the same log-likelihood for every request (to
1e-4: batches of other shapes); for the byte tokenizer (the EOS the export declares, "\\n") and GPT-2's.
"""

from __future__ import annotations

import contextlib
import json
import sys
from types import SimpleNamespace

import pytest

from normbench.run.eval_file import metrics_of, write_eval

from conftest import REPO, TINY, compose, run_cli

TASKS_DIR = "tests/data/eval_tasks"  # the tasks' data_files are relative to the repository root
MC, LM = "nb_tiny_mc", "nb_tiny_lm"


def _train(root, tokenizer: str):
    from normbench.train import trainer

    data = ["data=synthetic", "data.synthetic_tokens=30000", f"data.tokenizer={tokenizer}"]
    cfg = compose([*TINY, *data, "model.seq_len=32", "trainer.max_steps=12", "diag=off", "trainer.eval_every=12"])
    trainer.run(cfg, root / "run")
    return root / "run"


def _harness(model, tasks=(MC, LM)):
    """simple_evaluate on the local tasks, the samples logged: (results, {task: [(arguments, response)...]})."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=TASKS_DIR, include_defaults=False)
    out = lm_eval.simple_evaluate(model=model, tasks=list(tasks), task_manager=manager, log_samples=True)
    pairs = {t: [(a, r[0]) for s in out["samples"][t] for a, r in zip(s["arguments"], s["resps"])] for t in tasks}
    return out["results"], pairs


def _close(a, b, tol: float = 1e-4) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, bool):
        return a == b
    return abs(a - b) <= tol * max(1.0, abs(a))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(tokenizer)``: a tiny trained run (one per tokenizer and module)."""
    runs = {}

    def get(tokenizer: str):
        if tokenizer not in runs:
            runs[tokenizer] = _train(tmp_path_factory.mktemp(tokenizer), tokenizer)
        return runs[tokenizer]

    return get


@pytest.mark.parametrize("tokenizer", ["byte", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_eval_equals_the_harness_hf_model_on_the_export(tmp_path, monkeypatch, trained, tokenizer):
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from normbench import cli
    from normbench.export import export_run

    monkeypatch.chdir(REPO)
    run = trained(tokenizer)
    args = ["eval", str(run), "--tasks", f"{MC},{LM}", "--include-path", TASKS_DIR, "--batch-size", "5"]
    assert cli.main(args) == 0
    data = json.loads((run / "eval.json").read_text())
    assert data["harness"] == "lm-eval" and data["checkpoint_step"] == 12 and set(data["tasks"]) == {MC, LM}
    ours = data["tasks"][MC]
    assert (
        ours["n"] == 10 and ours["device"] == "cpu" and ours["precision"] == "fp32" and len(ours["config_hash"]) == 64
    )
    assert set(ours["metrics"]) == {"acc", "acc_norm"} and ours["metrics"]["acc"]["stderr"] > 0

    info = export_run(run, tmp_path / "out", log=lambda *_: None)
    hf = HFLM(pretrained=str(tmp_path / "out"), batch_size=3, device="cpu", trust_remote_code=info["kind"] == "custom")
    assert hf.eot_token_id == hf.prefix_token_id == (10 if tokenizer == "byte" else 50256)
    theirs, their_pairs = _harness(hf)
    for metric in ("acc", "acc_norm"):
        assert ours["metrics"][metric]["value"] == theirs[MC][f"{metric},none"], metric
    assert _close(data["tasks"][LM]["metrics"]["word_perplexity"]["value"], theirs[LM]["word_perplexity,none"])

    # every request's (log-likelihood, greedy), every document's rolling sum: normbench's LM on the same requests
    from normbench.downstream.lm import NormbenchLM
    from normbench.export.run import load_run, run_tokenizer

    loaded = load_run(run)
    lm = NormbenchLM(loaded.model, run_tokenizer(loaded.cfg), contextlib.nullcontext, batch_size=4)
    mc, rolling = their_pairs[MC], their_pairs[LM]
    assert len(mc) == 40 and len(rolling) == 10
    assert _close(lm.loglikelihood([SimpleNamespace(args=a) for a, _ in mc]), [r for _, r in mc])
    assert _close(lm.loglikelihood_rolling([SimpleNamespace(args=a) for a, _ in rolling]), [r for _, r in rolling])


def test_harness_metrics_become_eval_json_entries():
    entry = {
        "alias": "gsm8k",
        "exact_match,strict-match": 0.25,
        "exact_match_stderr,strict-match": 0.05,
        "exact_match,flexible-extract": 0.5,
        "exact_match_stderr,flexible-extract": "N/A",
        "acc,none": 0.75,
        "acc_stderr,none": 0.125,
    }
    assert metrics_of(entry) == {
        "exact_match,strict-match": {"value": 0.25, "stderr": 0.05},
        "exact_match,flexible-extract": {"value": 0.5, "stderr": None},
        "acc": {"value": 0.75, "stderr": 0.125},
    }


def test_eval_json_adds_tasks_for_the_same_checkpoint_and_starts_afresh_for_another(tmp_path):
    a = {"arc_easy": {"metrics": {"acc": {"value": 0.5, "stderr": 0.1}}}}
    b = {"piqa": {"metrics": {"acc": {"value": 0.6, "stderr": 0.1}}}}
    write_eval(tmp_path, "0.4.13", 100, a)
    assert set(write_eval(tmp_path, "0.4.13", 100, b)["tasks"]) == {"arc_easy", "piqa"}
    assert set(write_eval(tmp_path, "0.4.13", 200, b)["tasks"]) == {"piqa"}  # a later checkpoint: old scores go
    assert json.loads((tmp_path / "eval.json").read_text())["checkpoint_step"] == 200
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # no temp file left


def test_one_line_errors(tmp_path, monkeypatch, capsys):
    from normbench import cli
    from normbench.downstream.harness import task_manager
    from normbench.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    base = ["--tasks", MC, "--include-path", str(REPO / TASKS_DIR)]
    cases = [
        (["eval", "empty", *base], "empty has no checkpoint (expected empty/checkpoints/last.pt)"),
        (["eval", "nowhere", *base], "run directory nowhere does not exist"),
        (["eval", "empty", "--tasks", ","], "--tasks: name at least one task"),
        (["eval", "empty", *base, "--limit", "0"], "--limit=0 must be > 0"),
        (["eval", "empty"], "the following arguments are required: --tasks"),
    ]
    for args, needle in cases:
        assert cli.main(args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, lines)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # the `eval` extra not installed
    assert cli.main(["eval", "empty", *base]) == 2
    assert "pip install 'normbench[eval]'" in capsys.readouterr().err
    monkeypatch.undo()
    pytest.importorskip("lm_eval")
    with pytest.raises(ConfigError, match=r"--tasks nb_tiny_m: no such task .*\(close: nb_tiny_mc"):
        task_manager(["nb_tiny_m"], str(REPO / TASKS_DIR), include_defaults=False)
    with pytest.raises(ConfigError, match="--include-path nowhere: not a directory"):
        task_manager([MC], "nowhere")


def test_task_data_missing_offline_is_one_line(tmp_path, trained, capsys, monkeypatch):
    """A task whose data is neither local nor in the datasets cache, offline: one line naming the task and the
    docs section that says how to bring it over."""
    pytest.importorskip("lm_eval")
    import datasets

    from normbench import cli

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "nb_unfetched.yaml").write_text(
        "task: nb_unfetched\ndataset_path: nobody/not_fetched\noutput_type: multiple_choice\ntest_split: test\n"
        'doc_to_text: "{{q}}"\ndoc_to_target: label\ndoc_to_choice: "{{choices}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    args = ["eval", str(trained("byte")), "--tasks", "nb_unfetched", "--include-path", str(tmp_path / "tasks")]
    assert cli.main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("normbench: error: eval: cannot load the data of nb_unfetched (") and "§8" in last


@pytest.mark.slow
def test_an_unknown_task_names_the_close_ones_from_the_whole_index(tmp_path, trained):
    """The console command on a misspelt standard task: one line with lm-eval's own close names."""
    pytest.importorskip("lm_eval")
    proc = run_cli(["eval", str(trained("byte")), "--tasks", "arc_esay"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "normbench: error: --tasks arc_esay: no such task in lm-evaluation-harness (close: arc_easy"
    )


def test_the_eval_keys_are_checked_in_one_line():
    from normbench.errors import ConfigError
    from normbench.validation import prepare

    with pytest.raises(ConfigError, match=r"eval.every=5 must be a multiple of trainer.eval_every=10"):
        prepare(compose([*TINY, "eval.tasks=[piqa]", "eval.every=5"]))
    with pytest.raises(ConfigError, match=r"eval.batch_size"):
        prepare(compose([*TINY, "eval.batch_size=0"]))


@pytest.mark.slow
def test_in_training_scores_go_into_metrics_and_leave_training_as_it_was(tmp_path, monkeypatch):
    """eval.tasks during training: downstream/TASK/METRIC in the records of its steps, equal to `normbench eval` on
    the final checkpoint; the losses are those of the same run without it (the harness's seeding undone)."""
    pytest.importorskip("lm_eval")
    from normbench import cli
    from normbench.downstream.callback import DownstreamEval
    from normbench.run.metrics import read_jsonl
    from normbench.train import trainer

    monkeypatch.chdir(REPO)
    base = [*TINY, "data=synthetic", "data.synthetic_tokens=30000", "model.seq_len=32", "diag=off"]
    base += ["trainer.max_steps=8", "trainer.eval_every=4", "trainer.log_every=2", "model.dropout=0.1"]
    cfg = compose([*base, f"eval.tasks=[{MC}]", f"eval.include_path={TASKS_DIR}", "eval.every=4"])
    trainer.run(cfg, tmp_path / "with", callbacks=[DownstreamEval(cfg)])
    trainer.run(compose(base), tmp_path / "without")
    with_eval, without = (read_jsonl(tmp_path / d / "metrics.jsonl") for d in ("with", "without"))
    assert [r["loss"] for r in with_eval] == [r["loss"] for r in without]  # dropout draws: the RNG was kept
    scored = {r["step"]: r for r in with_eval if f"downstream/{MC}/acc" in r}
    assert sorted(scored) == [4, 8] and set(scored[8]) >= {f"downstream/{MC}/acc", f"downstream/{MC}/acc_norm"}
    assert cli.main(["eval", str(tmp_path / "with"), "--tasks", MC, "--include-path", TASKS_DIR]) == 0
    final = json.loads((tmp_path / "with" / "eval.json").read_text())["tasks"][MC]["metrics"]
    assert scored[8][f"downstream/{MC}/acc"] == final["acc"]["value"]
