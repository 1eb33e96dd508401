"""``normbench coordcheck``: the coordinate check of muP (Yang et al. 2022, arXiv:2203.03466, Fig. 5; microsoft/mup's
``get_coord_data``), SP and muP side by side, in width or (``--depth``) in depth for CompleteP.

Each width (or depth) and seed trains the model a few AdamW steps on real batches at one LR and records, at
every step t = 1..T before the update, the mean |x| of the embedding output, of each sublayer's output (the
attention and MLP cores, averaged over blocks), of the last block's residual stream and of the logits.
Under a parametrization whose hyperparameters transfer, none of them grows or shrinks with width once
training has moved the weights; under SP with Adam the logits and the residual stream grow about linearly.
The slope is that of log2 mean|x| against log2 width (a least-squares line over the widths, seeds averaged
first), at each step. ``coord.json`` holds every value and slope; ``coord.png`` draws mean|x| against width,
one line per step, one row per parametrization.

Hand-written rather than microsoft/mup's ``get_coord_data``: that needs its ``set_base_shapes`` and MuReadout
modules, and normbench's muP lives in the model and optimizer builders (model/mup.py) that train here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from normbench.config.files import compose_config
from normbench.errors import ConfigError, error

QUANTITIES = ("embed", "attn", "mlp", "resid", "logits")
BAND = 0.15  # |slope| under muP at the last steps: well under SP's logits slope (~0.5-1) at these widths
USAGE = """usage: python -m normbench coordcheck [--widths 32 64 128 256] [--depths 2 4 8 16] [--seeds N]
                                    [--steps N] [--lr LR] [--out DIR] [overrides...]

  the coordinate check: mean |x| of each layer's output against width (or depth) under SP and muP
  (CompleteP with --depths); writes DIR/coord.json (values and slopes) and DIR/coord.png
"""


def measure(overrides: list[str], steps: int, seed: int, lr: float, data=None) -> dict[str, list[float]]:
    """quantity -> mean |x| at steps 1..``steps`` (before each step's update) for one config and seed."""
    from normbench.data.batches import Batches  # deferred (start-up time): numpy
    from normbench.data.corpus import load_data  # deferred (start-up time): hydra, omegaconf, numpy
    from normbench.model import build_model, padded_vocab  # deferred (start-up time): hydra, omegaconf
    from normbench.model.gpt import Sublayer  # deferred (start-up time): hydra, omegaconf
    from normbench.optim.optimizers import build_optimizer  # deferred (start-up time): hydra, omegaconf
    from normbench.validation import prepare  # deferred (start-up time): hydra, omegaconf, numpy

    cfg, _ = prepare(compose_config([*overrides, f"optim.lr={lr}", f"seed={seed}", "sched=constant"]))
    data = data if data is not None else load_data(cfg.data, log=lambda *_: None)
    torch.manual_seed(seed)
    model = build_model(cfg, padded_vocab(cfg, data.vocab_size))
    opt = build_optimizer(model, cfg, log=lambda *_: None)
    batches = Batches(data.train, cfg.trainer.batch_size, cfg.model.seq_len, seed, torch.device("cpu"))
    seen: dict[str, list[float]] = {}

    def hook(name):
        def record(_mod, _inp, out):
            seen.setdefault(name, []).append(out.detach().abs().mean().item())

        return record

    handles = [sub.core.register_forward_hook(hook(n)) for n, sub in model.named_modules() if isinstance(sub, Sublayer)]
    out: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for _ in range(steps):
        x, y = batches.global_step(1, 0, 1)[0]
        seen.clear()
        hidden: list[torch.Tensor] = []
        logits, loss = model(x, y, hidden=hidden)
        out["embed"].append(hidden[0].detach().abs().mean().item())
        out["resid"].append(hidden[-1].detach().abs().mean().item())
        out["logits"].append(logits.detach().abs().mean().item())
        for q in ("attn", "mlp"):
            vals = [v for n, vs in seen.items() if n.endswith(f".{q}") for v in vs]
            out[q].append(sum(vals) / len(vals))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    for h in handles:
        h.remove()
    return out


def slope(sizes: list[int], values: list[float]) -> float:
    """Least-squares slope of log2 ``values`` against log2 ``sizes``."""
    xs, ys = [math.log2(s) for s in sizes], [math.log2(max(v, 1e-30)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def size_overrides(size: int, depth: bool, head_dim: int) -> list[str]:
    return [f"model.n_layer={size}"] if depth else [f"model.d_model={size}", f"model.n_head={size // head_dim}"]


def coord_check(
    overrides: list[str],
    sizes: list[int],
    seeds: int = 3,
    steps: int = 10,
    lr: float = 1e-2,
    depth: bool = False,
    params: tuple[str, ...] | None = None,
    first_seed: int = 0,
) -> dict:
    """Values and slopes for each parametrization: {param: {"values": {size: {q: [per step]}}, "slopes": ...}}."""
    from normbench.data.corpus import load_data  # deferred (start-up time): hydra, omegaconf, numpy

    base = compose_config(overrides)
    head_dim = int(base.model.mup_head_dim)
    data = load_data(base.data, log=lambda *_: None)
    params = params or (("sp", "completep") if depth else ("sp", "mup"))
    result: dict = {
        "sizes": sizes,
        "axis": "n_layer" if depth else "d_model",
        "seeds": seeds,
        "steps": steps,
        "lr": lr,
        "band": BAND,
        "overrides": overrides,
    }
    for param in params:
        per_size = {}
        for size in sizes:
            runs = [
                measure(
                    [*overrides, *size_overrides(size, depth, head_dim), f"model.param={param}"], steps, seed, lr, data
                )
                for seed in range(first_seed, first_seed + seeds)
            ]
            per_size[size] = {q: [sum(r[q][t] for r in runs) / seeds for t in range(steps)] for q in QUANTITIES}
        slopes = {q: [slope(sizes, [per_size[s][q][t] for s in sizes]) for t in range(steps)] for q in QUANTITIES}
        result[param] = {"values": per_size, "slopes": slopes}
    return result


def plot(result: dict, path: Path) -> Path:
    import matplotlib  # deferred (start-up time): matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred (start-up time): matplotlib

    params = [p for p in ("sp", "mup", "completep") if p in result]
    sizes, steps = result["sizes"], result["steps"]
    fig, axes = plt.subplots(
        len(params), len(QUANTITIES), figsize=(3.0 * len(QUANTITIES), 2.6 * len(params)), squeeze=False, sharex=True
    )
    cmap = plt.get_cmap("viridis")
    for row, param in zip(axes, params):
        for ax, q in zip(row, QUANTITIES):
            for t in range(steps):
                ys = [result[param]["values"][s][q][t] for s in sizes]
                ax.plot(sizes, ys, "o-", ms=3, color=cmap(t / max(1, steps - 1)), label=f"t={t + 1}")
            last = result[param]["slopes"][q][-1]
            ax.set_title(f"{param.upper()}  {q}: slope {last:+.2f} at t={steps}", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xticks(sizes, [str(s) for s in sizes])
            ax.tick_params(labelsize=7)
        row[0].set_ylabel("mean |x|", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel(result["axis"], fontsize=8)
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.suptitle(
        f"coordinate check: {result['seeds']} seeds, AdamW lr {result['lr']:g}, steps 1-{steps} "
        f"(slope: log2 mean|x| vs log2 {result['axis']}; flat = transfers)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _ints(args: list[str], flag: str, default: list[int]) -> list[int]:
    if flag not in args:
        return default
    i = args.index(flag) + 1
    vals = []
    while i < len(args) and args[i].isdigit():
        vals.append(int(args[i]))
        i += 1
    return vals


def main(argv: list[str]) -> int:

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    depth = "--depths" in argv
    sizes = _ints(argv, "--depths" if depth else "--widths", [2, 4, 8, 16] if depth else [32, 64, 128, 256])
    value = {f: argv[argv.index(f) + 1] for f in ("--seeds", "--steps", "--lr", "--out") if f in argv[:-1]}
    flags = {"--widths", "--depths", *value}
    overrides = [a for i, a in enumerate(argv) if "=" in a and not a.startswith("-")]
    unknown = [a for a in argv if a.startswith("-") and a not in flags]
    if unknown or len(sizes) < 2:
        return error(f"coordcheck: {unknown[0] if unknown else 'give at least two sizes'}; see --help")
    try:
        seeds, steps, lr = int(value.get("--seeds", 3)), int(value.get("--steps", 10)), float(value.get("--lr", 1e-2))
        base = ["model=tiny", "trainer.batch_size=8", *overrides]
        if depth:
            base.append("model.mup_base_depth=" + str(sizes[0]))
        result = coord_check(base, sizes, seeds, steps, lr, depth)
    except ValueError as exc:
        return error(f"coordcheck: {exc}")
    except ConfigError as exc:
        return error(str(exc))
    out = Path(value.get("--out", "outputs/coordcheck"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "coord.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "coord.png")
    for param in (p for p in ("sp", "mup", "completep") if p in result):
        slopes = ", ".join(f"{q} {result[param]['slopes'][q][-1]:+.2f}" for q in QUANTITIES)
        print(f"{param}: slopes at t={steps}: {slopes}")
    print(f"normbench: coordcheck: {out / 'coord.json'}, {out / 'coord.png'}")
    return 0
