"""PNG plots for the reports (matplotlib, Agg backend, imported only when a pack is built).

Each plot comes back as a `view.Figure`: the PNG bytes, the report section it belongs to, and a
caption that tells the reader what to look at. Plots must not hide data: series that overlap
are drawn with distinct markers and said to be identical, every axis names its unit, the noise
band is drawn as a band, and every drill phase carries its duration."""
from __future__ import annotations

import io
import statistics
from pathlib import Path

from trainops.run_records import read_metrics
from trainops.skills.evidence.model import EvidencePack
from trainops.skills.evidence.view import Figure

MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", ":", "-.")
PHASE_COLOURS = {"detection": "#d97706", "isolation": "#7c3aed", "recovery": "#2563eb"}
VERDICT_COLOURS = {"gain": "#1a7f37", "regression": "#cf222e", "within-noise": "#8c959f"}
STEP_TIME_BAND_PCT = 25.0
"""The step-time colour scales are fixed at ± this much of the median step time, so run-to-run
noise of a few tenths of a percent stays one colour and only a real straggler stands out."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # parse_math off: labels carry run text (a peak_source, a knob value), and a `$` in it is not mathtext
    plt.rcParams.update({"font.size": 10, "axes.spines.top": False, "axes.spines.right": False,
                         "text.parse_math": False})
    return plt


def _png(plt, fig, tight: bool = True) -> bytes:
    """The figure as PNG bytes, then freed (pyplot keeps every open figure alive)."""
    buffer = io.BytesIO()
    if tight:
        fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def share_ceiling(values: list[float]) -> float:
    """The top of a share's axis, from zero: 100% when the values reach a fifth of it, else a round
    ceiling above them that the axis label names, so a share is never drawn on a range chosen by
    its noise."""
    top = max(values, default=0.0)
    if top >= 20:
        return 100.0
    for ceiling in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20):
        if top <= ceiling * 0.9:
            return float(ceiling)
    return 100.0


def _versus_median(values: list[float], median: float) -> list[float]:
    return [100.0 * (v / median - 1.0) if median else float("nan") for v in values]


def _identical(series: list[list[float]]) -> bool:
    return len(series) > 1 and all(s == series[0] for s in series[1:])


def _plot_repeats(ax, runs: list[tuple[str, list[int], list[float]]]) -> None:
    """One line per repeat, each with its own marker and dash, so an overlapped line still shows."""
    for index, (name, steps, values) in enumerate(runs):
        ax.plot(steps, values, label=name, marker=MARKERS[index % len(MARKERS)], markersize=8 - 1.5 * (index % 3),
                linestyle=LINESTYLES[index % len(LINESTYLES)], linewidth=1.4, fillstyle="none" if index else "full",
                alpha=0.9)


def curves(pack: EvidencePack) -> Figure | None:
    """Loss and MFU per step for every baseline repeat, warm-up steps shaded."""
    if not pack.baseline:
        return None
    plt = _pyplot()
    base = pack.baseline
    runs = [(Path(d).name, [r for r in read_metrics(d) if r.rank == 0]) for d in base.run_dirs]
    loss = [(name, [r.step for r in recs], [r.loss for r in recs]) for name, recs in runs]
    mfu = [(name, [r.step for r in recs], [r.mfu_pct for r in recs]) for name, recs in runs]
    fig, (ax_loss, ax_mfu) = plt.subplots(1, 2, figsize=(11, 3.8))
    _plot_repeats(ax_loss, loss)
    _plot_repeats(ax_mfu, mfu)
    for ax in (ax_loss, ax_mfu):
        if base.warmup_steps_excluded:
            ax.axvspan(0.5, base.warmup_steps_excluded + 0.5, color="#d0d7de", alpha=0.5, label="warm-up (excluded)")
        ax.set_xlabel("training step (count)")
        ax.grid(alpha=0.3)
    same_loss, same_mfu = _identical([v for _, _, v in loss]), _identical([v for _, _, v in mfu])
    ax_loss.set(title="loss per step" + (" (identical in every repeat)" if same_loss else ""),
                ylabel="training loss (cross-entropy, nats)")
    top = share_ceiling([v for _, _, values in mfu for v in values if v is not None])
    ax_mfu.set_ylim(0, top)
    ax_mfu.set(title="MFU per step" + (" (identical in every repeat)" if same_mfu else ""),
               ylabel=f"MFU (% of peak, axis 0-{top:g}%; peak: {base.peak_source})")
    ax_loss.legend(fontsize=8, title="repeat (run folder)", title_fontsize=8)
    caption = ("Look for: MFU settling after the shaded warm-up steps, and how far the repeats sit apart (the noise "
               "band every ablation is judged against).")
    identical = [name for name, same in (("loss", same_loss), ("MFU", same_mfu)) if same]
    if identical:
        caption += (f" The {' and '.join(identical)} curves of all {len(loss)} repeats are identical, so their lines "
                    "overlap; each repeat keeps its own marker.")
    return Figure("s2", "loss_mfu", caption, _png(plt, fig))


def ablation_bars(pack: EvidencePack) -> Figure | None:
    """MFU change per arm, each bar over the grey band of run-to-run noise at its scale."""
    if not pack.ablations:
        return None
    from matplotlib.patches import Patch, Rectangle

    plt = _pyplot()
    rows = pack.ablations
    fig, ax = plt.subplots(figsize=(11, 3.8))
    positions = range(len(rows))
    for x, row in zip(positions, rows, strict=True):
        ax.add_patch(Rectangle((x - 0.42, -row.noise_band_pct), 0.84, 2 * row.noise_band_pct, color="#8c959f",
                               alpha=0.25, linewidth=0, zorder=1))
    ax.bar(positions, [r.mfu_change_pct for r in rows], width=0.5, zorder=2,
           color=[VERDICT_COLOURS[r.verdict] for r in rows])
    for x, row in zip(positions, rows, strict=True):
        ax.annotate(f"{row.mfu_change_pct:+.1f}%", (x, row.mfu_change_pct), textcoords="offset points",
                    xytext=(0, 4 if row.mfu_change_pct >= 0 else -12), ha="center", fontsize=9)
    reach = max(max(abs(r.mfu_change_pct), r.noise_band_pct) for r in rows) or 1.0
    ax.set_ylim(-reach * 1.3, reach * 1.3)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(list(positions), [f"{r.knob}={r.value}\n{r.scale_kind} scale" for r in rows], fontsize=8)
    ax.set(title="MFU change of each arm against its baseline", ylabel="MFU change vs baseline median (%)",
           xlabel="arm (knob=value, scale)")
    ax.legend(handles=[Patch(color="#8c959f", alpha=0.25, label="baseline noise band (run-to-run spread)"),
                       *[Patch(color=colour, label=verdict) for verdict, colour in VERDICT_COLOURS.items()]],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    caption = ("Look for: bars that leave the grey band, the only real changes (a bar inside it is run-to-run noise "
               "whatever its sign).")
    return Figure("s3", "ablation", caption, _png(plt, fig))


def ladder(pack: EvidencePack) -> Figure | None:
    """MFU change per rung of each arm's rollout ladder, over the grey noise band of that rung; the
    rung where the gain was gone (and the ladder stopped) is marked."""
    arms: dict[tuple[str, str], list] = {}
    for row in pack.ablations:
        if row.world_size is not None:
            arms.setdefault((row.knob, row.value), []).append(row)
    climbed = {arm: rows for arm, rows in arms.items() if len(rows) > 1 or rows[0].stop}
    if not climbed:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(climbed), figsize=(5.5 * len(climbed), 3.8), squeeze=False)
    for ax, ((knob, value), rows) in zip(axes[0], climbed.items(), strict=True):
        positions = list(range(len(rows)))
        bands = [r.noise_band_pct for r in rows]
        ax.fill_between(positions, [-b for b in bands], bands, color="#8c959f", alpha=0.25, linewidth=0,
                        label="noise band at the rung (baseline run-to-run spread)")
        ax.plot(positions, [r.mfu_change_pct for r in rows], color="#1f2328", linewidth=1.2, zorder=2)
        ax.scatter(positions, [r.mfu_change_pct for r in rows], color=[VERDICT_COLOURS[r.verdict] for r in rows],
                   zorder=3, s=40)
        for x, row in zip(positions, rows, strict=True):
            ax.annotate(f"{row.mfu_change_pct:+.1f}%" + ("\nstopped, rolled back" if row.stop else ""),
                        (x, row.mfu_change_pct), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
            if row.stop:
                ax.scatter([x], [row.mfu_change_pct], marker="x", color="#cf222e", s=120, zorder=4,
                           label="gain gone: the ladder stopped here")
        reach = max(max(abs(r.mfu_change_pct), r.noise_band_pct) for r in rows) or 1.0
        ax.set_ylim(-reach * 1.4, reach * 1.4)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(positions, [r.scale.replace(" x ", " x\n") for r in rows], fontsize=8)
        ax.set(title=f"{knob}={value} (baseline {rows[0].baseline_value})", xlabel="rung (processes, then nodes)",
               ylabel="MFU change vs the rung's baseline (%)")
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(axis="y", alpha=0.3)
    caption = ("Look for: the rung where a point falls back into the grey band, where the gain was gone and the "
               "ladder stopped, reverted and verified the baseline.")
    return Figure("s3", "ladder", caption, _png(plt, fig))


def drill_timeline(pack: EvidencePack) -> Figure | None:
    """Injection -> detection -> isolation -> recovery, one row per drill, each phase labelled."""
    if not pack.fault_tolerance or not pack.fault_tolerance.drills:
        return None
    plt = _pyplot()
    drills = pack.fault_tolerance.drills
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.9 * len(drills)))
    span = max(d.recovered_time - d.injected_time for d in drills) or 1.0
    for row, d in enumerate(drills):
        marks = [0.0, d.detected_time - d.injected_time, d.isolated_time - d.injected_time,
                 d.recovered_time - d.injected_time]
        summary = []
        for (phase, colour), start, end in zip(PHASE_COLOURS.items(), marks[:-1], marks[1:], strict=True):
            ax.barh(row, end - start, left=start, height=0.5, color=colour, label=phase if row == 0 else None)
            summary.append(f"{phase} {end - start:.2f} s")
            if end - start > 0.12 * span:
                ax.text((start + end) / 2, row, f"{end - start:.2f} s", ha="center", va="center", color="white",
                        fontsize=9, fontweight="bold")
        ax.text(0, row + 0.32, " · ".join(summary), va="top", fontsize=9, color="#1f2328")
    ax.set_yticks(range(len(drills)), [d.fault for d in drills])
    ax.set_ylim(-0.5, len(drills) - 0.2)
    ax.invert_yaxis()
    ax.set_xlim(0, span * 1.02)
    ax.set(title="drill timeline from fault injection", xlabel="time since injection (s)",
           ylabel="drill (fault injected)")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(1.0, 0.0), title="phase", title_fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    caption = ("Look for: the phase that dominates each drill (recovery here runs from isolation to the first step "
               "after the restart; the table's recovery time counts from detection).")
    return Figure("s5", "drill_timeline", caption, _png(plt, fig))


def rank_heatmap(pack: EvidencePack) -> Figure | None:
    """Step time per rank and step (MegaScale's straggler view) against the median step time after
    the warm-up, on a fixed ±STEP_TIME_BAND_PCT scale: a slow rank is a red row, a slow step on
    every rank a red column, and noise stays pale."""
    split = pack.baseline.bottleneck if pack.baseline else None
    records = [r for r in read_metrics(split.ranks_run) if r.step_time_s is not None] if split else []
    if not records:
        return None
    plt = _pyplot()
    ranks, steps = sorted({r.rank for r in records}), sorted({r.step for r in records})
    warmup = pack.baseline.warmup_steps_excluded
    measured = [r.step_time_s for r in records if r.step > warmup] or [r.step_time_s for r in records]
    median = statistics.median(measured)
    grid = [[float("nan")] * len(steps) for _ in ranks]
    for r in records:
        grid[ranks.index(r.rank)][steps.index(r.step)] = _versus_median([r.step_time_s], median)[0]
    fig, ax = plt.subplots(figsize=(11, 1.8 + 0.35 * len(ranks)))
    image = ax.imshow(grid, aspect="auto", cmap="RdBu_r", interpolation="nearest", vmin=-STEP_TIME_BAND_PCT,
                      vmax=STEP_TIME_BAND_PCT, extent=(steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5, -0.5))
    fig.colorbar(image, ax=ax, extend="both", label="vs median step time (%)")
    if warmup:
        ax.axvline(warmup + 0.5, color="#1f2328", linestyle="--", linewidth=1.5, label="end of warm-up")
        ax.legend(fontsize=8, loc="upper right", framealpha=0.9)
    ax.set_xticks(steps if len(steps) <= 30 else steps[::max(1, len(steps) // 30)])
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set(title=f"step time per rank and step ({Path(split.ranks_run).name}) against the median "
                 f"{median * 1e3:.1f} ms, scale fixed at ±{STEP_TIME_BAND_PCT:g}%", xlabel="training step (count)",
           ylabel="rank (index)")
    caption = (f"Look for: a red row (a straggler rank slows every step) or a red column (a step slow on all ranks: "
               f"data, a checkpoint); the scale is fixed at ±{STEP_TIME_BAND_PCT:g}% of the median step time.")
    return Figure("s2", "rank_step_heatmap", caption, _png(plt, fig))


def layout_view(pack: EvidencePack) -> Figure | None:
    """The dp x tp grid of each pipeline stage, each cell a rank coloured by its median step time
    against the median over ranks (fixed ±STEP_TIME_BAND_PCT) and labelled with its exposed
    communication, so time spent in one parallel group shows."""
    split = pack.baseline.bottleneck if pack.baseline else None
    if not split or not split.ranks:
        return None
    plt = _pyplot()
    dp, tp, pp = split.layout["dp"], split.layout["tp"], split.layout["pp"]
    fig, axes = plt.subplots(1, pp, figsize=(min(11, 4.5 + 3.2 * pp), 2.4 + 0.6 * dp), squeeze=False,
                             layout="constrained")
    median = statistics.median(r.step_time_median_s for r in split.ranks)
    for stage, ax in enumerate(axes[0]):
        grid = [[float("nan")] * tp for _ in range(dp)]
        for r in split.ranks:
            if r.pp == stage:
                grid[r.dp][r.tp] = _versus_median([r.step_time_median_s], median)[0]
                comm = ("exposed comm n/a" if r.exposed_comm_share_pct is None
                        else f"exposed comm {r.exposed_comm_share_pct:.0f}%")
                ax.text(r.tp, r.dp, f"rank {r.rank}\n{r.step_time_median_s * 1e3:.1f} ms\n{comm}", ha="center",
                        va="center", fontsize=8, bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
        image = ax.imshow(grid, cmap="RdBu_r", aspect="auto", vmin=-STEP_TIME_BAND_PCT, vmax=STEP_TIME_BAND_PCT)
        ax.set_xticks(range(tp), [f"tp {i}" for i in range(tp)])
        ax.set_yticks(range(dp), [f"dp {i}" for i in range(dp)])
        ax.set_title(f"pipeline stage {stage}", fontsize=9)
        ax.set(xlabel="tensor-parallel coordinate (index)", ylabel="data-parallel coordinate (index)")
    fig.colorbar(image, ax=list(axes[0]), extend="both", label="vs median over ranks (%)")
    fig.suptitle(f"layout dp={dp} x tp={tp} x pp={pp}: median step time per rank against the median over ranks "
                 f"{median * 1e3:.1f} ms\n(scale fixed at ±{STEP_TIME_BAND_PCT:g}%)", fontsize=10)
    caption = ("Look for: a red cell, row or column, the parallel group (dp replica, tp group, pipeline stage) where "
               "the time goes; each cell gives its rank's exposed communication.")
    return Figure("s2", "layout_view", caption, _png(plt, fig, tight=False))


def all_plots(pack: EvidencePack) -> list[Figure]:
    return [f for f in (curves(pack), rank_heatmap(pack), layout_view(pack), ablation_bars(pack), ladder(pack),
                        drill_timeline(pack)) if f]
