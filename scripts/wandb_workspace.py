"""A W&B workspace (or report) for one normbench sweep, with the panels ``normbench report`` draws.

    python scripts/wandb_workspace.py outputs/multirun/2026-05-01/12-00-00-123456 [--entity TEAM]
    python scripts/wandb_workspace.py SWEEP_DIR --report            # a W&B report instead of a workspace
    python scripts/wandb_workspace.py SWEEP_DIR --dry-run [--out spec.json]   # build only, no network

The sweep's jobs logged with ``logger=wandb`` into one W&B group (the last two parts of the
sweep dir, see ``normbench.diag.wandb_logger.sweep_group``); the sweep must be synced first if it
ran offline (``wandb sync SWEEP_DIR/*/wandb/offline-run-*``). The workspace shows only that
group, grouped by the overrides that vary in the sweep (seeds are averaged, as in the report),
with sections: loss curves (train/val loss, grad norm, lr, tokens/s), val loss (best/final
val loss per group, val loss vs lr for an lr sweep), depth profiles (the ``depth/<metric>``
charts: metric vs depth at diag steps) and one section per per-layer metric
(``var_resid``, ``grad_norm_layer``, ``maxabs_resid``: a panel per layer).

Needs ``wandb-workspaces`` (``pip install wandb-workspaces``) and, to save, a W&B login.
:func:`panel_spec` is the plain-dict specification; :func:`build_workspace` and
:func:`build_report` turn it into wandb-workspaces objects; saving is the only network step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from normbench.diag.wandb_logger import DEPTH_KEYS, sweep_group
from normbench.report import find_runs, group_runs

GROUP_OPTIONS = ("model", "arch", "norm", "optim", "sched", "data", "diag")  # config groups: <group>.name in W&B
LAYER_SECTIONS = (  # (metric, entries per model: n_layer + offset, log scale)
    ("var_resid", 1, True),
    ("grad_norm_layer", 0, True),
    ("maxabs_resid", 1, True),
)
LOSS_PANELS = (
    ("train loss", "loss", False),
    ("val loss", "val_loss", False),
    ("gradient norm (total, before clipping)", "grad_norm", True),
    ("learning rate", "lr", False),
    ("tokens/s", "tokens_per_s", False),
)


def wandb_key(override_key: str) -> str:
    """The W&B config key of an override: ``arch`` -> ``arch.name``, ``optim.lr`` stays."""
    return f"{override_key}.name" if override_key in GROUP_OPTIONS else override_key


def sweep_info(sweep_dir: Path) -> dict:
    """What the spec needs from a local sweep dir: group, varying keys, depth, project/entity."""
    runs = find_runs(sweep_dir)
    if not runs:
        raise SystemExit(f"wandb_workspace: no runs below {sweep_dir}")
    groups = group_runs(runs)
    varying = []
    for g in groups:  # label "k1=v1 k2=v2": the keys that vary (seed left out)
        for item in g.label.split():
            key = item.split("=", 1)[0]
            if "=" in item and key not in varying:
                varying.append(key)
    n_layer = max((int(r.config.get("model", {}).get("n_layer") or 0) for r in runs), default=0)
    wcfg = next((r.config.get("logger", {}).get("wandb") for r in runs if r.config.get("logger")), None) or {}
    return {
        "group": wcfg.get("group") or sweep_group(sweep_dir),  # logger.wandb.group wins, as in the jobs
        "varying": varying,
        "n_layer": n_layer,
        "lr_sweep": any(k == "lr" or k.endswith(".lr") for k in varying),
        "project": wcfg.get("project") or "normbench",
        "entity": wcfg.get("entity"),
    }


def panel_spec(group: str, varying: list[str], n_layer: int, lr_sweep: bool = False) -> dict:
    """The workspace as plain data: a runset filter and grouping, and sections of panels.

    A panel is ``{"kind": "line" | "bar" | "scatter" | "custom", "title": ..., ...}``:
    line: ``y`` (history key), ``x`` = step, ``log_y``; bar: ``metrics`` (summary keys);
    scatter: ``x`` (config key), ``y`` (summary key), ``log_x``; custom: a ``wandb.plot``
    chart, ``table`` (the logged table key) and ``chart`` (its Vega spec).
    """
    sections = [
        {
            "name": "loss curves",
            "panels": [
                {"kind": "line", "title": title, "x": "step", "y": key, "log_y": log} for title, key, log in LOSS_PANELS
            ],
        },
        {
            "name": "val loss",
            "panels": [
                {"kind": "bar", "title": "best val loss", "metrics": ["best_val_loss"]},
                {"kind": "bar", "title": "final val loss", "metrics": ["final_val_loss"]},
            ]
            + (
                [
                    {
                        "kind": "scatter",
                        "title": "best val loss vs learning rate",
                        "x": "optim.lr",
                        "y": "best_val_loss",
                        "log_x": True,
                    }
                ]
                if lr_sweep
                else []
            ),
        },
        {
            "name": "depth profiles",
            "panels": [
                {
                    "kind": "custom",
                    "title": f"{key} vs depth",
                    "table": f"depth/{key}_table",
                    "chart": "wandb/lineseries/v0",
                    "fields": {"step": "step", "lineKey": "lineKey", "lineVal": "lineVal"},
                    "strings": {
                        "title": f"{key} vs depth",
                        "xname": "block" if key == "grad_norm_layer" else "depth (0 = embedding)",
                    },
                }
                for key in DEPTH_KEYS
            ],
        },
    ]
    for metric, offset, log in LAYER_SECTIONS:
        n = n_layer + offset
        sections.append(
            {
                "name": metric,
                "panels": [
                    {
                        "kind": "line",
                        "title": f"{metric}/layer_{i:02d}",
                        "x": "step",
                        "y": f"{metric}/layer_{i:02d}",
                        "log_y": log,
                    }
                    for i in range(n)
                ],
            }
        )
    return {
        "filter": {"group": group},
        "groupby": [wandb_key(k) for k in varying if k != "seed"],
        "sections": sections,
    }


def _panels(section: dict):
    import wandb_workspaces.reports.v2 as wr

    out = []
    for p in section["panels"]:
        if p["kind"] == "line":
            out.append(wr.LinePlot(title=p["title"], x=p["x"], y=[p["y"]], log_y=p["log_y"] or None))
        elif p["kind"] == "bar":
            out.append(wr.BarPlot(title=p["title"], metrics=[wr.SummaryMetric(m) for m in p["metrics"]]))
        elif p["kind"] == "scatter":
            out.append(
                wr.ScatterPlot(title=p["title"], x=wr.Config(p["x"]), y=wr.SummaryMetric(p["y"]), log_x=p["log_x"])
            )
        elif p["kind"] == "custom":
            out.append(
                wr.CustomChart(
                    query={"summaryTable": {"tableKey": p["table"]}},
                    chart_name=p["chart"],
                    chart_fields=p["fields"],
                    chart_strings=p["strings"],
                )
            )
        else:
            raise ValueError(f"unknown panel kind {p['kind']!r}")
    return out


def build_workspace(spec: dict, entity: str, project: str, name: str):
    import wandb_workspaces.workspaces as ws

    return ws.Workspace(
        entity=entity,
        project=project,
        name=name,
        sections=[ws.Section(name=s["name"], panels=_panels(s), is_open=i < 3) for i, s in enumerate(spec["sections"])],
        settings=ws.WorkspaceSettings(x_axis="step"),
        runset_settings=ws.RunsetSettings(
            filters=ws.And(ws.Metric("Group") == spec["filter"]["group"]),
            groupby=[ws.Config(k) for k in spec["groupby"]],
        ),
    )


def build_report(spec: dict, entity: str, project: str, title: str):
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    runset = wr.Runset(
        entity=entity,
        project=project,
        name=spec["filter"]["group"],
        filters=expr.And(expr.Metric("Group") == spec["filter"]["group"]),
        groupby=[f"config.{k}" for k in spec["groupby"]],
    )
    blocks = [wr.P(f"normbench sweep {spec['filter']['group']}: the panels of `normbench report`.")]
    for section in spec["sections"]:
        blocks += [wr.H2(section["name"]), wr.PanelGrid(runsets=[runset], panels=_panels(section))]
    return wr.Report(entity=entity, project=project, title=title[:128], blocks=blocks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path, help="a sweep dir of `normbench train -m` (logged with logger=wandb)")
    ap.add_argument("--entity", help="W&B entity (default: logger.wandb.entity of the jobs, else your default)")
    ap.add_argument("--project", help="W&B project (default: logger.wandb.project of the jobs)")
    ap.add_argument("--group", help="W&B group (default: derived from the sweep dir, as the jobs logged it)")
    ap.add_argument("--name", help="workspace/report name (default: normbench <group>)")
    ap.add_argument("--report", action="store_true", help="create a W&B report instead of a workspace")
    ap.add_argument("--dry-run", action="store_true", help="build the specification only (no network)")
    ap.add_argument("--out", type=Path, help="write the specification (JSON) here")
    args = ap.parse_args(argv)

    info = sweep_info(args.sweep_dir)
    group = args.group or info["group"]
    spec = panel_spec(group, info["varying"], info["n_layer"], info["lr_sweep"])
    project = args.project or info["project"]
    entity = args.entity or info["entity"]
    name = args.name or f"normbench {group}"
    if entity is None and not args.dry_run:
        import wandb

        entity = wandb.Api().default_entity  # needs a login
    try:
        obj = (build_report if args.report else build_workspace)(spec, entity or "(your entity)", project, name)
    except ImportError:
        print("wandb_workspace: needs `pip install wandb-workspaces`", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(json.dumps({"spec": spec, "entity": entity, "project": project, "name": name}, indent=1))
    if args.dry_run:
        print(
            yaml.safe_dump(
                {
                    "group": group,
                    "groupby": spec["groupby"],
                    "sections": {s["name"]: len(s["panels"]) for s in spec["sections"]},
                },
                sort_keys=False,
            )
        )
        return 0
    obj.save()
    print(f"wandb_workspace: {'report' if args.report else 'workspace'} saved: {obj.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
