"""Weights & Biases logging (``logger=wandb``); a no-op unless enabled, rank 0 only.

One W&B run per job: project/entity/job_type from ``logger.wandb``, group = the
sweep (the last two parts of Hydra's sweep dir, e.g. ``2026-05-01/12-00-00-123456``;
see :func:`sweep_group`; a single run has none), tags = arch/norm/optim (plus the
status of a run that did not complete), name = the job's overrides, and the full
resolved config plus where the job sits in its sweep (``hydra.*``). At ``finish()``
the run summary gets summary.json's status, outcome (learned/unstable/stuck/diverged),
reason, losses and per-layer statistics; every diag record also logs those statistics
as ``layer_stats/<name>`` scalars (:func:`normbench.diag.outcomes.step_stats`).

Per-layer lists become flat keys in sections (``grad_norm_layer`` ->
``grad_norm_layer/layer_03``), so W&B draws one panel group per metric. For the
metrics the report plots against depth, ``depth/<metric>`` is a metric-vs-depth line
chart with one line per diag step (at most 6: first, last, evenly spaced), logged at
diag records 1, 2, 4, 8, ... and at the end, so a long run writes O(log n) small tables.

Each run calls ``finish()`` with the job's exit code, so the next job of an in-process
sweep gets its own run and a crashed job shows as failed; the run id is kept in the
checkpoint so a resumed run continues it. Without credentials, or if W&B cannot be
reached, an online run falls back to offline with a warning: logging never stops
training. ``WANDB_MODE=disabled`` (or ``logger.wandb.mode=disabled``) makes it a no-op.

W&B's own console lines (its banner, the run history and summary tables at the end, about
34 lines per run) go to the run's ``train.log``, not the console: ``wandb.init`` and
``finish`` run with stdout/stderr redirected there, so a sweep's console shows normbench's
lines only. W&B writes them through ``sys.stderr``, looked up at each call.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
from pathlib import Path
from urllib.parse import urlparse

from hydra.types import RunMode
from omegaconf import OmegaConf

from normbench.config.schema import as_dict
from normbench.diag.outcomes import step_stats
from normbench.run.reader import RunReader
from normbench.run.resume import BOOKKEEPING_KEYS
from normbench.run.rundir import RunDir

log = logging.getLogger("normbench")

# per-layer metrics drawn as metric-vs-depth line charts (the report's depth plots)
DEPTH_KEYS = ("var_resid", "grad_norm_layer", "maxabs_resid")
DEPTH_LINES = 6  # diag steps per chart: first, last and evenly spaced between
# summary.json fields copied into the W&B run summary at finish()
SUMMARY_KEYS = (
    "status",
    "reason",
    "best_val_loss",
    "final_val_loss",
    "final_loss",
    "tokens_per_s",
    "spikes",
    "n_params",
    "wall_s",
    "outcome",
    "baseline_loss",
    "n_spikes",
    "var_growth",
    "grad_spread",
    "grad_cv",
    "massive_ratio_peak",
    "massive_ratio_step",
    "logit_maxabs",
)


def flatten_record(record: dict) -> dict:
    """Per-layer lists become ``<metric>/layer_NN``; ``spike_steps`` (step numbers) stays out:
    the ``spikes`` count charts it."""
    out = {}
    for key, value in record.items():
        if key == "spike_steps":
            continue
        if isinstance(value, list):
            for i, v in enumerate(value):
                out[f"{key}/layer_{i:02d}"] = v
        elif value is not None:
            out[key] = value
    return out


def _has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    # `wandb login` writes the API host to ~/.netrc; a self-hosted server has its own host
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.exists() and host in netrc.read_text(errors="replace")
    except OSError:
        return False


def _hydra_job():
    """Hydra's config of the running job, or None outside a Hydra app."""
    try:
        from hydra.core.hydra_config import HydraConfig  # its failure is handled here

        return HydraConfig.get() if HydraConfig.initialized() else None
    except Exception:  # pragma: no cover - Hydra is a hard dependency
        return None


def sweep_group(sweep_dir: str | Path) -> str:
    """The W&B group of every job of the sweep in ``sweep_dir``: its last two path parts
    (``outputs/multirun/2026-05-01/12-00-00-123456`` -> ``2026-05-01/12-00-00-123456``)."""
    parts = Path(os.path.abspath(sweep_dir)).parts
    return "/".join(parts[-2:])[-128:]  # W&B limits group names to 128 characters


def _group(run_dir: Path) -> str | None:
    """Jobs of one multirun share a group; a single run has none."""
    hc = _hydra_job()
    if hc is not None:
        return sweep_group(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
    parent = run_dir.resolve().parent
    return sweep_group(parent) if (parent / "multirun.yaml").exists() else None


def _run_name(run_dir: Path, cfg) -> str:
    """The job's overrides, minus the keys Hydra leaves out of the job dir name."""
    hc = _hydra_job()
    if hc is not None:
        items, exclude = list(hc.overrides.task), set(hc.job.config.override_dirname.exclude_keys)
    else:
        items, exclude = RunReader(run_dir).overrides, set(BOOKKEEPING_KEYS)
    items = [str(i) for i in items if str(i).split("=", 1)[0].lstrip("+~") not in exclude]
    return " ".join(items) if items else f"{cfg.arch.name}-{cfg.norm.name}-s{cfg.seed}"


def _hydra_info() -> dict:
    """Where the job sits in its sweep, logged beside the config (filters in W&B)."""
    hc = _hydra_job()
    if hc is None:
        return {}

    return {  # job.num / override_dirname are unset in a single (non-sweep) run
        "job_num": OmegaConf.select(hc, "job.num", default=None),
        "override_dirname": OmegaConf.select(hc, "job.override_dirname", default=None),
        "output_dir": hc.runtime.output_dir,
        "choices": {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")},
    }


class _ToRunLog(io.TextIOBase):
    """A text stream whose lines go to the normbench logger's file handlers (train.log) only."""

    def __init__(self):
        self.handlers = [h for h in log.handlers if isinstance(h, logging.FileHandler)]
        self.buffer = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if line.strip():
                record = log.makeRecord(log.name, logging.INFO, __file__, 0, "%s", (line.rstrip(),), None)
                for h in self.handlers:
                    h.handle(record)
        return len(text)

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _into_run_log():
    """W&B's console output goes to train.log for the duration."""
    stream = _ToRunLog()
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            yield
    finally:
        stream.write("\n")


def _finite_or_none(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _pick(steps: list[int], n: int = DEPTH_LINES) -> list[int]:
    """At most ``n`` of ``steps``, evenly spaced, first and last included."""
    if len(steps) <= n:
        return steps
    idx = sorted({round(i * (len(steps) - 1) / (n - 1)) for i in range(n)})
    return [steps[i] for i in idx]


class WandbLogger:
    def __init__(self, cfg, run_dir: Path, resume_id: str | None = None):
        self.run = None
        self.run_id = resume_id
        self.run_dir = Path(run_dir)
        self._profiles: dict[str, dict[int, list]] = {k: {} for k in DEPTH_KEYS}
        self._min_step = self._last_step = 0
        self._n_diag = self._charted = 0  # diag records seen / when depth charts were last logged
        wcfg = cfg.logger.wandb
        if not (wcfg.enabled or cfg.logger.name == "wandb"):
            return
        mode = wcfg.mode or os.environ.get("WANDB_MODE") or "online"
        if mode == "disabled":
            return
        if mode == "online" and not _has_credentials():
            log.warning(
                "logger=wandb: no W&B credentials (WANDB_API_KEY or `wandb login`); logging offline "
                "to %s/wandb (upload later with `wandb sync`)",
                run_dir,
            )
            mode = "offline"
        import wandb  # deferred (start-up time): wandb

        config = as_dict(cfg)
        if info := _hydra_info():
            config["hydra"] = info
        kwargs = dict(
            project=wcfg.project,
            entity=wcfg.entity,
            group=wcfg.group or _group(self.run_dir),
            tags=list(wcfg.tags) or [cfg.arch.name, cfg.norm.name, cfg.optim.name],
            job_type=wcfg.job_type,
            name=_run_name(self.run_dir, cfg),
            config=config,
            dir=str(self.run_dir),
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="finish_previous",
        )
        try:
            with _into_run_log():
                self.run = wandb.init(mode=mode, **kwargs)
        except Exception as exc:  # W&B unreachable, bad entity...: keep training, log offline
            if mode != "online":
                raise
            log.warning("logger=wandb: %s; logging offline to %s/wandb instead", str(exc).splitlines()[0], run_dir)
            with _into_run_log():
                self.run = wandb.init(mode="offline", **kwargs)
        self.run_id = self.run.id
        if resume_id:
            # W&B drops steps below the run's last step: skip them instead of warning on each
            self._min_step = int(getattr(self.run, "step", 0) or 0)
            self._restore_profiles()
            log.info("logger=wandb: continuing W&B run %s", self.run_id)

    def _restore_profiles(self) -> None:
        """The depth charts of a resumed run span the whole run: refill them from metrics.jsonl
        (already cut back to the checkpoint's step when this runs)."""
        for record in RunReader(self.run_dir).metrics:
            if self._collect_profiles(record):
                self._n_diag += 1
        self._charted = self._n_diag  # those charts were logged by the first process

    def _collect_profiles(self, record: dict) -> bool:
        found = False
        for key in DEPTH_KEYS:
            if isinstance(record.get(key), list) and record[key]:
                self._profiles[key][record["step"]] = [_finite_or_none(v) for v in record[key]]
                found = True
        return found

    def log(self, record: dict) -> None:
        if self.run is None or record["step"] < self._min_step:
            return
        data = flatten_record(record)
        # per-layer statistics (outcomes.step_stats) as scalars, so dashboards chart them over steps
        data.update({f"layer_stats/{k}": v for k, v in step_stats(record).items()})
        if self._collect_profiles(record):
            self._n_diag += 1
            if self._n_diag & (self._n_diag - 1) == 0:  # diag records 1, 2, 4, 8, ...: O(log n) tables
                data.update(self._depth_charts())
        self.run.log(data, step=record["step"])
        self._last_step = record["step"]

    def _depth_charts(self) -> dict:
        """``depth/<metric>``: one line per chosen diag step, x = depth (layer index)."""
        import wandb  # deferred (start-up time): wandb

        charts = {}
        for key, profiles in self._profiles.items():
            if not profiles:
                continue
            last = max(profiles)
            steps = [s for s in _pick(sorted(profiles)) if len(profiles[s]) == len(profiles[last])]
            charts[f"depth/{key}"] = wandb.plot.line_series(
                xs=list(range(len(profiles[last]))),
                ys=[profiles[s] for s in steps],
                keys=[f"step {s}" for s in steps],
                title=f"{key} vs depth",
                xname="block" if key == "grad_norm_layer" else "depth (0 = embedding)",
            )
        self._charted = self._n_diag
        return charts

    def finish(self, exit_code: int = 0) -> None:
        if self.run is None:
            return
        try:
            if self._n_diag != self._charted:  # the last diag step's charts, if not logged yet
                self.run.log(self._depth_charts(), step=self._last_step)  # W&B steps only go up
            self._summarize()
        except Exception as exc:  # extras only: never let them fail the job or hide its own error
            log.warning("logger=wandb: could not log the final charts/summary: %s", exc)
        finally:
            with _into_run_log():
                self.run.finish(exit_code=exit_code)
            self.run = None

    def _summarize(self) -> None:
        """Copy the run's status (completed/diverged/failed...) and results into the W&B summary."""

        summary = RunDir(self.run_dir).read_summary()
        if summary is None or summary.get("status") == "unreadable":
            return
        self.run.summary.update({k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None})
        status = summary.get("status")
        if status in ("diverged", "failed", "interrupted"):
            self.run.tags = tuple(dict.fromkeys([*self.run.tags, status]))
        if summary.get("outcome") in ("stuck", "unstable"):  # learned: no tag; diverged: tagged above
            self.run.tags = tuple(dict.fromkeys([*self.run.tags, summary["outcome"]]))
