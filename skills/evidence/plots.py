"""PNG plots for the HTML report (matplotlib, Agg backend, imported only when a pack is built)."""
from __future__ import annotations

import json
from pathlib import Path

from trainops.skills.evidence.model import EvidencePack


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Write the figure as a small PNG and free it (pyplot keeps every open figure alive)."""
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def read_metrics(run_dir: str | Path, rank: int = 0) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in records if r.get("rank", 0) == rank]


def curves(pack: EvidencePack, out_dir: Path) -> Path | None:
    """Loss and MFU per step for every baseline repeat."""
    if not pack.baseline:
        return None
    plt = _pyplot()
    fig, (ax_loss, ax_mfu) = plt.subplots(1, 2, figsize=(10, 3.5))
    for run_dir in pack.baseline.run_dirs:
        records = read_metrics(run_dir)
        steps = [r["step"] for r in records]
        ax_loss.plot(steps, [r["loss"] for r in records], label=Path(run_dir).name)
        ax_mfu.plot(steps, [r["mfu_pct"] for r in records], label=Path(run_dir).name)
    ax_loss.set(title="loss", xlabel="step")
    ax_mfu.set(title=f"MFU % ({pack.baseline.peak_source})", xlabel="step")
    ax_loss.legend(fontsize=7)
    return _save(plt, fig, out_dir / "loss_mfu.png")


def ablation_bars(pack: EvidencePack, out_dir: Path) -> Path | None:
    """MFU change per arm, with the noise band drawn as an error bar."""
    if not pack.ablations:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [f"{r.knob}={r.value}\n{r.scale_kind}" for r in pack.ablations]
    colors = {"gain": "tab:green", "regression": "tab:red", "within-noise": "tab:gray"}
    ax.bar(labels, [r.mfu_change_pct for r in pack.ablations],
           yerr=[r.noise_band_pct for r in pack.ablations], capsize=4,
           color=[colors[r.verdict] for r in pack.ablations])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(title="MFU change vs baseline (error bar = noise band)", ylabel="%")
    ax.tick_params(axis="x", labelsize=7)
    return _save(plt, fig, out_dir / "ablation.png")


def drill_timeline(pack: EvidencePack, out_dir: Path) -> Path | None:
    """Injection -> detection -> isolation -> recovery, one row per drill, seconds from injection."""
    if not pack.fault_tolerance or not pack.fault_tolerance.drills:
        return None
    plt = _pyplot()
    drills = pack.fault_tolerance.drills
    fig, ax = plt.subplots(figsize=(8, 1 + 0.6 * len(drills)))
    for row, d in enumerate(drills):
        detect = d.detected_time - d.injected_time
        isolate = d.isolated_time - d.injected_time
        recover = d.recovered_time - d.injected_time
        ax.barh(row, detect, color="tab:orange", label="detection" if row == 0 else None)
        ax.barh(row, isolate - detect, left=detect, color="tab:purple", label="isolation" if row == 0 else None)
        ax.barh(row, recover - isolate, left=isolate, color="tab:blue", label="recovery" if row == 0 else None)
    ax.set_yticks(range(len(drills)), [d.fault for d in drills])
    ax.set(title="drill timeline (s after injection)", xlabel="s")
    ax.legend(fontsize=7, loc="lower right")
    return _save(plt, fig, out_dir / "drill_timeline.png")


def all_plots(pack: EvidencePack, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [p for p in (curves(pack, out_dir), ablation_bars(pack, out_dir), drill_timeline(pack, out_dir)) if p]
