"""gpu_check.sh's table, from each run's summary.json under OUT, and its copy in docs/performance.md.

    python scripts/gpu_table.py OUT --common "OVERRIDES" --archs "pre_ln ngpt ..." [--skipped "..."]
                                [--doc docs/performance.md --header "GPU, torch, settings"]

One row per arch (and the eager pre_ln, the reference of the eager sweep): status, tokens/s, model
FLOP/s against pre_ln run the same way (compiled against the compiled pre_ln, eager against the
eager one: summary.json's ``compiled``), MFU, peak memory (against pre_ln's and against
normbench.runtime.memory's estimate), set-up and compile seconds, step time, loss, and how it ran.
``--doc`` puts the table between the ``<!-- gpu_check table -->`` and ``<!-- /gpu_check table -->``
lines of that file (its GPU section), replacing what was there. Exit status 1 when a run did not complete.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGET = 0.45  # pre_ln MFU on an H100/H200 (llm-foundry reports 43-45% for 125M)
BEGIN, END = "<!-- gpu_check table -->", "<!-- /gpu_check table -->"
FMT = "{:<16} {:>10} {:>10} {:>8} {:>7} {:>9} {:>7} {:>8} {:>9} {:>8} {:>7} {:>8}"


def load(out: Path, name: str) -> dict | None:
    path = out / name / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def estimate_gb(common: list[str], arch: str) -> float | None:
    try:
        from normbench.config.files import compose_config
        from normbench.model import padded_vocab
        from normbench.runtime.memory import estimate

        cfg = compose_config([*common, f"arch={arch}"])
        return estimate(cfg, padded_vocab(cfg, 50257), "cuda").total / 1e9
    except Exception:  # the table is still useful without the estimate
        return None


def cell(s: dict, key: str, spec: str) -> str:
    v = s.get(key)
    return "-" if v is None else format(v, spec)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def row(name: str, s: dict, ref: dict, est: float | None) -> str:
    flops = lambda d: (d.get("tokens_per_s") or 0) * (d.get("flops_per_token") or 0)
    mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
    mem_est = "-" if not est or s.get("peak_mem_gb") is None else f"{s['peak_mem_gb'] / est:.2f}"
    setup = "-"
    if s.get("wall_s") and s.get("step_time_s") and s.get("max_steps"):
        setup = f"{s['wall_s'] - s['max_steps'] * s['step_time_s']:.0f}"
    mode = {True: "compiled", False: "eager"}.get(s.get("compiled"), "-")
    return FMT.format(
        name,
        str(s.get("status")),
        cell(s, "tokens_per_s", ",.0f"),
        ratio(flops(s), flops(ref)),
        mfu,
        cell(s, "peak_mem_gb", ".1f"),
        ratio(s.get("peak_mem_gb"), ref.get("peak_mem_gb")),
        mem_est,
        setup,
        cell(s, "step_time_s", ".3f"),
        cell(s, "final_loss", ".3f"),
        mode,
    )


def table(out: Path, common: list[str], archs: list[str], skipped: set[str]) -> tuple[list[str], bool]:
    """The table's lines and whether a run did not complete."""
    if "pre_ln" not in archs and (out / "pre_ln" / "summary.json").exists():
        archs.insert(0, "pre_ln")  # a second try into the same OUT: the reference of its ratios
    names = list(archs)
    if load(out, "pre_ln_eager") and "pre_ln" in names:
        names.insert(names.index("pre_ln") + 1, "pre_ln_eager")
    ref, eager = load(out, "pre_ln") or {}, load(out, "pre_ln_eager")
    lines = [
        "",
        FMT.format(
            "arch",
            "status",
            "tokens/s",
            "FLOP/s/x",
            "MFU",
            "mem (GB)",
            "mem/x",
            "mem/est",
            "setup s",
            "step (s)",
            "loss",
            "mode",
        ),
        "(x = pre_ln run the same way, compiled or eager; setup s = wall time - steps x steady step time: "
        "start-up, and compiling for a compiled run)",
        "-" * 120,
    ]
    bad = False
    for name in names:
        s = load(out, name) or {"status": "skipped" if name in skipped else "no summary"}
        own_ref = eager if s.get("compiled") is False and eager else ref
        arch = "pre_ln" if name == "pre_ln_eager" else name
        lines.append(row(name, s, own_ref, estimate_gb(common, arch)))
        bad |= s.get("status") not in ("completed", "skipped")
    if eager and ref.get("tokens_per_s") and eager.get("tokens_per_s"):
        speedup = ref["tokens_per_s"] / eager["tokens_per_s"]
        lines += [
            "",
            f"compile speed-up, pre_ln: {speedup:.2f}x (eager {eager['tokens_per_s']:,.0f} tokens/s, MFU "
            f"{100 * (eager.get('mfu') or 0):.1f}%): the 'saving' of compile=auto's CUDA profile is "
            f"{1 - 1 / speedup:.0%}",
        ]
    if ref.get("mfu") is not None:
        verdict = "met" if ref["mfu"] >= TARGET else "NOT met"
        lines.append(f"target MFU >= {TARGET:.0%} for pre_ln: {verdict} ({100 * ref['mfu']:.1f}%)")
    for path in sorted(out.glob("claims/*/verdict.json")):
        v = json.loads(path.read_text())
        lines.append(
            f"claim smoke run {path.parent.name}: {v.get('verdict')} with {v.get('n_seeds')} seed(s) "
            "(the claim machinery ran end to end on this GPU; one seed decides nothing)"
        )
    ddp = load(out, "ddp_smoke")
    if ddp is not None:
        lines.append(
            f"DDP 2-process smoke run: {ddp.get('status')} (world size {ddp.get('world_size')}, "
            f"loss {ddp.get('final_loss')})"
        )
        bad |= ddp.get("status") != "completed"
    return lines, bad


def write_doc(doc: Path, lines: list[str], header: str) -> None:
    """The table between the markers of ``doc``, in place of what was there; the markers must be there."""
    text = doc.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"gpu_table: {doc} has no single '{BEGIN}' ... '{END}' block to write the table into")
    head, rest = text.split(BEGIN)
    body = "\n".join([BEGIN, "", header, "", "```", *[ln for ln in lines if ln], "```", "", END])
    doc.write_text(head + body + rest.split(END, 1)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--common", default="", help="the Hydra overrides the arch runs share (for the memory estimate)")
    p.add_argument("--archs", required=True)
    p.add_argument("--skipped", default="")
    p.add_argument("--doc", help="write the table into this file's gpu_check block")
    p.add_argument("--header", default="", help="the line above the table in --doc (GPU, torch, settings)")
    a = p.parse_args()
    lines, bad = table(Path(a.out), a.common.split(), a.archs.split(), set(a.skipped.split()))
    print("\n".join(lines))
    if a.doc:
        write_doc(Path(a.doc), lines, a.header)
        print(f"gpu_check: the table is in {a.doc}'s GPU section")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
