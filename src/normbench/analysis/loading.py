"""Finding runs, reading what they wrote, and choosing which to compare and how to group them.

Each run directory is read by :class:`normbench.run.reader.RunReader`, the one reader of a run
(``.hydra/{config,overrides}.yaml``, ``metrics.jsonl``, ``summary.json``, ``.lock``). Anything may
be missing or half-written (a sweep still running, a job killed mid-write): nothing here raises
on a damaged run; it shows up as ``failed``/``running``/``stopped`` with a reason, and a ``summary.json``
that cannot be parsed as ``unreadable`` (:func:`unreadable_summaries` names each such file, for a warning).
A run whose process died without a word (kill -9, out of memory, a lost node: ``summary.json`` still says
``running`` and no live process holds its ``.lock``) is ``stopped``: resumable, not a failure; its reason
holds the command that resumes it.
"""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from normbench.config.schema import qk_norm_mode
from normbench.diag.outcomes import classify, finite
from normbench.errors import ConfigError
from normbench.run.commands import resume_command
from normbench.run.reader import RunReader, load_yaml, read_metrics  # noqa: F401 - load_yaml, read_metrics: report's API
from normbench.run.resume import BOOKKEEPING_KEYS
from normbench.run.rundir import UNREADABLE, RunDir

SUMMARY_FIRST = ("arch", "norm", "optim", "seed")  # the run itself wrote these into summary.json


def series(records: list[dict], key: str) -> list[tuple[int, object]]:
    """(step, value) for records that have ``key``, sorted by step; a later record wins
    (a resumed run logs again the steps after its last checkpoint)."""
    by_step = {r["step"]: r[key] for r in records if r.get(key) is not None}
    return sorted(by_step.items())


def finite_series(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(s, v) for s, v in series(records, key) if finite(v)]


@dataclass
class Run:
    path: Path
    config: dict
    overrides: list[str]
    summary: dict | None
    records: list[dict]
    live: bool = False  # a live process holds the run's .lock
    lock_left: bool = False  # a .lock file is there (held by a live run, or left by one that died)
    root: Path | None = None  # the directory it was found under (for display)
    downstream: dict | None = None  # eval.json (normbench eval's scores; run/eval_file.py), None without one

    @property
    def status(self) -> str:
        status = str((self.summary or {}).get("status") or "")
        if status and status != "running":
            return status
        if self.live:
            return "running"
        if status == "running" or self.records or self.lock_left:
            return "stopped"  # it died without a word after it started: resumable (docs/reliability.md)
        return "failed"  # nothing written at all (e.g. refused before it could)

    @property
    def outcome(self) -> str | None:
        """learned / unstable / stuck / diverged (normbench.diag.outcomes), or None: no outcome yet
        (running, failed, interrupted) or not known (a summary from before outcomes, without a baseline)."""
        s = self.summary or {}
        if self.status == "diverged":
            return "diverged"
        if self.status != "completed":
            return None
        if s.get("outcome") is not None:
            return str(s["outcome"])
        spikes = s.get("n_spikes", s.get("spikes"))
        return classify("completed", self.val_losses[1], s.get("baseline_loss"), spikes if finite(spikes) else 0)

    @property
    def outcome_label(self) -> str:
        """The outcome, or for a run without one its status ("running", "failed", ...; "unknown")."""
        return self.outcome or (self.status if self.status != "completed" else "unknown")

    @property
    def val_losses(self) -> tuple[float | None, float | None]:
        """(final, best) val loss: from summary.json, else from the metrics logged so far."""
        s = self.summary or {}
        vals = [v for _, v in finite_series(self.records, "val_loss")]
        final = s.get("final_val_loss") if finite(s.get("final_val_loss")) else (vals[-1] if vals else None)
        best = s.get("best_val_loss") if finite(s.get("best_val_loss")) else (min(vals) if vals else None)
        return final, best

    @property
    def name(self) -> str:
        """The run's path relative to the directory it was found under."""
        if self.root is None or self.root == self.path:
            return self.path.name
        return str(self.path.relative_to(self.root))

    @property
    def last_step(self):
        return max((r["step"] for r in self.records), default=(self.summary or {}).get("step"))

    @property
    def reason(self) -> str:
        if self.summary and self.summary.get("status") != "running":
            return str(self.summary.get("reason") or "")
        step = self.last_step
        if self.live:
            where = _remote_holder(self.path)
            return (f"no summary yet, at step {step}" if step is not None else "starting") + where
        if self.status == "stopped":
            at = f"after logging step {step}" if self.records else "before logging a step"
            why = "killed, out of memory or a lost node?"
            return f"died without a word {at} ({why}); resume with: {self.resume_command}"
        return "no data"

    @property
    def resume_command(self) -> str:
        """The command that resumes this run where it is, from its own overrides (.hydra/overrides.yaml)."""
        return resume_command(self.overrides, run_dir=self.path.resolve())


def _remote_holder(run_dir: Path) -> str:
    """For a run held from another host (liveness unknown here): which host, and how long ago
    the run last wrote, so a job killed on a cluster node is recognisable."""
    rd = RunDir(run_dir)
    host, _ = rd.lock_owner()
    if not host or host == socket.gethostname():
        return ""
    age = rd.last_write_age()
    return f" (on {host})" if age is None else f" (on {host}, last write {age / 60:.0f} min ago)"


def load_run(path: Path, root: Path | None = None) -> Run:
    run = RunReader(path)
    return Run(
        path=path,
        config=run.config,
        overrides=run.overrides,
        summary=run.summary,  # damaged: status "unreadable", never mistaken for "failed"
        records=run.metrics,
        live=run.live,
        lock_left=run.dir.lock_path.exists(),
        root=root,
        downstream=run.downstream(),
    )


def unreadable_summaries(runs: list[Run]) -> list[str]:
    """One line per run whose ``summary.json`` exists but cannot be trusted (not valid JSON, not an object,
    unreadable), naming the file: the report lists such a run as ``unreadable`` and reads nothing from it."""
    lines = []
    for run in runs:
        summary = run.summary or {}
        if summary.get("status") == UNREADABLE:
            path = RunDir(run.path).summary_path
            reason = str(summary.get("reason") or "summary.json cannot be read").replace("summary.json", str(path), 1)
            lines.append(f"{reason}; the run is listed as unreadable")
    return lines


def _natural(p: Path) -> list:
    """Natural order, so Hydra's job dirs 0, 1, ..., 10 keep the sweep's order."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def find_runs(root: Path) -> list[Run]:
    """Every run at or below ``root``: a directory with summary.json, metrics.jsonl or
    .hydra/config.yaml (so running and crashed jobs are found too). Links are followed (a claim's run
    served by another claim's, reproduce/store.py), each directory once: one run reached by two paths is
    found once, under the first path in natural order that is no link, else the first."""
    root = Path(root)
    dirs, seen = [], set()
    for here, subdirs, files in os.walk(root, followlinks=True):
        real, here = os.path.realpath(here), Path(here)
        if "summary.json" in files or "metrics.jsonl" in files or (here / ".hydra" / "config.yaml").is_file():
            dirs.append(here)
        if real in seen:  # reached by a second path (or a link back into the tree): not walked again
            subdirs[:] = []
        seen.add(real)
    chosen: dict[str, Path] = {}
    direct = lambda d: os.path.realpath(d) == os.path.abspath(d)  # no link on its path
    for d in sorted(set(dirs), key=_natural):
        real = os.path.realpath(d)
        if real not in chosen or (direct(d) and not direct(chosen[real])):
            chosen[real] = d
    return [load_run(d, root) for d in sorted(chosen.values(), key=_natural)]


def load_runs(dirs: list[Path]) -> list[Run]:
    """The runs below any number of run or sweep directories, each once (a directory and its
    parent may both be given). Names are relative to the common parent of ``dirs``."""
    dirs = [Path(d) for d in dirs]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"no such directory: {d}")
    common = Path(os.path.commonpath([d.resolve() for d in dirs]))
    if len(dirs) == 1:
        common = dirs[0].resolve()
    seen: dict[Path, Run] = {}
    for d in dirs:
        for run in find_runs(d):
            key = run.path.resolve()
            if key not in seen:
                run.root = common if len(dirs) > 1 else d
                if len(dirs) > 1:
                    run.path = key
                seen[key] = run
    return list(seen.values())


# ----------------------------------------------------------------------------- settings


def norm_value(value: str) -> str:
    """``1e-3`` and ``0.001`` (or ``12`` and ``12.0``, or ``True`` and ``true``) must group together.
    (Hydra's sweeper writes a swept boolean as Python spells it: ``False``.)"""
    if value.lower() in ("true", "false"):
        return value.lower()
    try:
        f = float(value)
    except ValueError:
        return value
    if not math.isfinite(f):
        return value
    return str(int(f)) if f.is_integer() and abs(f) < 1e15 else repr(f)


def canonical_value(key: str, value: str | None) -> str | None:
    """A setting in its current spelling: the old boolean ``arch.qk_norm`` reads true -> head, false -> none."""
    if key == "arch.qk_norm" and value is not None:
        return qk_norm_mode(value)
    return value


def setting(run: Run, key: str) -> str | None:
    """A run's value for a key (``arch``, ``optim.lr``, ``model.n_layer``, ...): its override,
    else its config, else its summary; in its current spelling (:func:`canonical_value`).

    arch/norm/optim/seed come from the summary first: the run itself wrote them (a resume
    refused for a changed arch leaves no trace there)."""
    return canonical_value(key, _setting(run, key))


def _setting(run: Run, key: str) -> str | None:
    if key in SUMMARY_FIRST and (run.summary or {}).get(key) is not None:
        return norm_value(str(run.summary[key]))
    for o in run.overrides:
        k, sep, v = o.partition("=")
        if sep and k.lstrip("+~") == key:
            return norm_value(v)
    node = run.config
    for part in key.replace("/", ".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):  # a config group: arch -> arch.name
        node = node.get("name")
    if node is None and key in SUMMARY_FIRST:
        node = (run.summary or {}).get(key)
    if isinstance(node, bool):
        return str(node).lower()
    return None if node is None else norm_value(str(node))


def is_lr_key(key: str) -> bool:
    return key == "lr" or key.endswith(".lr")


def varying_keys(runs: list[Run]) -> list[str]:
    """Override keys whose values differ between runs, in the order Hydra wrote them, without
    ``seed`` (averaged over) and bookkeeping (resume flags, logger)."""
    keys = {}  # ordered set
    for run in runs:
        for o in run.overrides:
            k, sep, _ = o.partition("=")
            k = k.lstrip("+~")
            if sep and k != "seed" and not k.startswith("hydra") and k not in BOOKKEEPING_KEYS:
                keys[k] = None
    return [k for k in keys if len({setting(r, k) for r in runs}) > 1]


def check_key(runs: list[Run], key: str, flag: str) -> None:
    if any(setting(r, key) is not None for r in runs):
        return
    known = sorted({o.partition("=")[0].lstrip("+~") for r in runs for o in r.overrides} | set(SUMMARY_FIRST))
    raise ConfigError(f"{flag}: no run has a value for {key!r} (keys the runs override: {', '.join(known)})")


def parse_assignment(text: str, flag: str) -> tuple[str, list[str]]:
    """``KEY=VALUE[,VALUE...]`` -> (key, normalized values)."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"{flag} expects KEY=VALUE (e.g. {flag} arch=pre_ln), got {text!r}")
    return key.strip(), [norm_value(v.strip()) for v in values.split(",")]


def filter_runs(runs: list[Run], filters: list[str] | None) -> list[Run]:
    """Keep the runs whose setting matches every ``KEY=VALUE[,VALUE]`` (values of one key: any of them)."""
    for text in filters or []:
        key, values = parse_assignment(text, "--filter")
        check_key(runs, key, "--filter")
        kept = [r for r in runs if setting(r, key) in values]
        if not kept:
            seen = sorted({v for r in runs if (v := setting(r, key)) is not None})
            raise ConfigError(f"--filter {text}: no run matches (values of {key}: {', '.join(seen)})")
        runs = kept
    return runs


@dataclass
class Group:
    label: str
    series: str  # the label without the learning rate: one line in the lr sweep
    settings: dict[str, str]  # the grouping keys and this group's values
    runs: list[Run] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return setting(self.runs[0], "arch") or "?"

    @property
    def norm(self) -> str:
        return setting(self.runs[0], "norm") or "?"


def group_runs(runs: list[Run], group_by: list[str] | None = None) -> list[Group]:
    """Group by ``group_by`` (keys as in :func:`setting`), by default by the overrides whose
    values differ between runs (:func:`varying_keys`); seeds are always averaged over."""
    if group_by:
        for key in group_by:
            check_key(runs, key, "--group-by")
    keys = list(group_by) if group_by else varying_keys(runs)
    groups: dict[str, Group] = {}
    for run in runs:
        values = {k: setting(run, k) or "?" for k in keys}
        default = f"arch={setting(run, 'arch') or '?'} norm={setting(run, 'norm') or '?'}"
        label = " ".join(f"{k}={v}" for k, v in values.items()) or default
        series = " ".join(f"{k}={v}" for k, v in values.items() if not is_lr_key(k)) or default
        groups.setdefault(label, Group(label, series, values)).runs.append(run)
    return list(groups.values())
