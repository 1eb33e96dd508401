"""``python -m normbench eval RUN_DIR [RUN_DIR ...] --tasks T1,T2``: downstream scores into each run's eval.json."""

from __future__ import annotations

import os

from normbench.downstream import require_harness
from normbench.errors import ConfigError, Parser, error


def parse(argv: list[str]):
    p = Parser(
        prog="python -m normbench eval",
        description="Score runs on lm-evaluation-harness tasks with normbench's own model; "
        "writes eval.json into each run (docs/contract.md §3).",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (with checkpoints/last.pt)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task (or group) names")
    p.add_argument("--include-path", help="a folder of task YAML files of your own (lm-eval's --include_path)")
    p.add_argument("--limit", type=float, help="score only the first N documents of each task (a test, not a score)")
    p.add_argument("--batch-size", type=int, default=32, help="requests per forward pass (default 32)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default: the run's own device key")
    args = p.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks:
        raise ConfigError("--tasks: name at least one task (e.g. --tasks arc_easy,piqa)")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size={args.batch_size} must be >= 1")
    if args.limit is not None:
        if args.limit <= 0:
            raise ConfigError(f"--limit={args.limit:g} must be > 0 (N documents, or a fraction below 1)")
        args.limit = int(args.limit) if args.limit >= 1 else args.limit
    return args


def _checked_runs(run_dirs: list[str]) -> None:
    """Every run has a checkpoint before any is scored: a typo ends the command before an hour of work."""
    from normbench.run.reader import RunReader  # deferred (start-up time): yaml

    for run_dir in run_dirs:
        if not os.path.isdir(run_dir):
            raise ConfigError(f"run directory {run_dir} does not exist")
        path = RunReader(run_dir).checkpoint_path
        if not path.is_file():
            raise ConfigError(f"{run_dir} has no checkpoint (expected {path}); nothing to evaluate until it writes one")


def main(argv: list[str]) -> int:

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        args = parse(argv)
        require_harness()
        _checked_runs(args.run_dirs)
        from normbench.downstream.harness import evaluate_run, task_manager  # deferred (start-up time): torch, yaml

        manager = task_manager(args.tasks, args.include_path)
        for run_dir in args.run_dirs:
            data = evaluate_run(run_dir, args.tasks, manager, args.limit, args.batch_size, args.device)
            print(_line(run_dir, data, args.tasks))
    except ConfigError as exc:
        return error(str(exc))
    except OSError as exc:
        return error(f"eval: {exc.filename or ''} {exc.strerror or exc}".strip())
    return 0


def _line(run_dir: str, data: dict, tasks: list[str]) -> str:
    """``RUN (step S): task acc 0.412 ± 0.010, acc_norm ...; task ...``: what was written."""
    parts = []
    for task in tasks:
        metrics = data["tasks"].get(task, {}).get("metrics", {})
        shown = [
            f"{m} {v['value']:.4f}" + (f" ± {v['stderr']:.4f}" if v["stderr"] is not None else "")
            for m, v in metrics.items()
        ]
        parts.append(f"{task} {', '.join(shown)}")
    return f"{run_dir} (step {data['checkpoint_step']}): {'; '.join(parts)} -> {os.path.join(run_dir, 'eval.json')}"
