"""The report's figures section: each figure with its caption, in a fixed order (loss, LR/grad norm,
depth, heatmaps, per-layer statistics, the LR sweep); a figure without data is a line saying why."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from normbench.report import figures
from normbench.report.figures import curves as curve_figures
from normbench.report.figures import layers as layer_figures
from normbench.report.figures import lr_sweep as lr_figure


@dataclass
class Gallery:
    """The figures drawn so far: their page blocks and the files written (every format of each)."""

    out_dir: Path
    save: figures.Output
    steps: list[int] | None  # the depth plots' chosen steps (None: each figure's default)
    legend: str  # which factor is the colour, which the line style: said under every line figure
    blocks: list[tuple] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)

    def add(self, name: str, made: bool, what: str, key: str, caption: str, lines: bool = True) -> None:
        """The figure ``name`` with its heading and caption; one that was not made, a line saying why."""
        if not made:  # say why instead of leaving a hole
            at = " at the chosen steps" if self.steps and key != "loss" else ""
            self.blocks.append(("p", f"`{name}` skipped: no run logged `{key}`{at}."))
            return
        stem = Path(name).stem
        self.plots.extend(self.out_dir / f"{stem}.{ext}" for ext in dict.fromkeys(("png", *self.save.formats)))
        others = ", ".join(f"`{stem}.{e}`" for e in self.save.formats if e != "png")
        also = f" (also {others})" if others else ""
        caption += self.legend if lines else ""
        self.blocks.extend([("h", 3, f"`{name}`{also}"), ("img", name, what, caption)])


def figure_section(
    groups,
    styles,
    sweep,
    steps,
    out_dir: Path,
    save: figures.Output,
    x: str = "step",
    runs_too: bool = False,
) -> Gallery:
    """Each figure with its caption (the setup is stated once, above them): the page's blocks and the files
    written. The PNG is embedded; the other formats lie next to it."""
    two_factors = styles.style_key and len(styles.linestyles) > 1
    style = f"; line style and point marker: `{styles.style_key}`" if two_factors else ""
    gallery = Gallery(out_dir, save, steps, f" Colour: `{styles.color_key}`{style}.")
    _curves(gallery, groups, styles, x, runs_too)
    _layers(gallery, groups, styles)
    if sweep:
        lr_figure.plot_lr(sweep, groups, styles, out_dir / "lr_sweep.png", save)
        what = "best validation loss against the peak learning rate, one line per group"
        caption = (
            "Best validation loss against the peak learning rate: filled point, every seed learned; "
            "hollow, some did not; squares, stuck runs; ×, an lr where a run diverged."
        )
        gallery.add("lr_sweep.png", True, what, "val_loss", caption)
    return gallery


def _curves(gallery: Gallery, groups, styles, x: str, runs_too: bool) -> None:
    """Loss and LR/grad norm against the chosen x axis."""
    out, save = gallery.out_dir, gallery.save
    x_key, x_label = figures.X_AXES[x]
    made = curve_figures.plot_losses(groups, styles, out / "loss_curves.png", save, x, runs_too)
    what = f"training and validation loss against {x_label}, one line per group"
    key = curve_figures.missing(groups, ("loss", x_key)) or "loss"
    gallery.add("loss_curves.png", made, what, key, curve_figures.caption_losses(groups, x, runs_too))
    made = curve_figures.plot_dynamics(groups, styles, out / "lr_grad_norm.png", save, x, runs_too)
    what = curve_figures.DYNAMICS_ALT.replace("training step", x_label)
    key = curve_figures.missing(groups, (x_key,)) or "lr"
    gallery.add("lr_grad_norm.png", made, what, key, curve_figures.caption_dynamics(groups, x, runs_too))


def _layers(gallery: Gallery, groups, styles) -> None:
    """Statistics against depth at chosen steps, the per-layer heatmaps and per-layer statistics over time."""
    out, save = gallery.out_dir, gallery.save
    for key, (name, *_) in curve_figures.DEPTH.items():
        chosen = gallery.steps if gallery.steps else curve_figures.default_depth_steps(groups, key)
        made = curve_figures.plot_depth(groups, styles, key, chosen, out / name, save)
        gallery.add(name, made, curve_figures.ALT[key], key, curve_figures.caption_depth(key, chosen, groups))
    for key, (name, *_) in layer_figures.HEATMAPS.items():
        made = layer_figures.plot_heatmap(groups, key, out / name, save)
        gallery.add(name, made, layer_figures.ALT[key], key, layer_figures.caption_heatmap(key), lines=False)
    made = layer_figures.plot_layer_stats(groups, styles, out / "layer_stats.png", save)
    what = "per-layer statistics against training step, one panel each"
    gallery.add("layer_stats.png", made, what, "var_resid", layer_figures.LAYER_CAPTION)
