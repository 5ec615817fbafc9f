"""Comparisons with sources (SOP step 7): each ablation arm against MegaScale's published
breakdown, the baseline against same-generation MLPerf Training results, every item with its
source and the scale and hardware difference to this run, each comparison built as the
claim model `ExternalComparison` (R-EVD-3: no source or no scale difference is refused). The
figures live in published.json beside this file (shipped as package data); nothing here makes one up."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainops.skills.evidence.model import AblationRow, PackEnvironment
from trainops.skills.evidence.published import MlperfComparison, MlperfResult
from trainops.tools.governance.claims import ExternalComparison

DATA_PATH = Path(__file__).with_name("published.json")
GENERATIONS = ("Blackwell", "Hopper", "Ada Lovelace", "Ampere", "Volta", "CDNA 3")
NO_SAME_GENERATION = "no same-generation result"
SCALE_FACTOR = 10
"""A reference system is comparable only with a GPU run within this factor of its accelerator
count: beyond it the difference says more about scale than about the change measured."""


@lru_cache(maxsize=1)
def published() -> dict[str, Any]:
    return json.loads(DATA_PATH.read_text(encoding="utf-8"))


def devices(env: PackEnvironment | None, world: int) -> str:
    """How this run's ranks are named: GPUs on a GPU run, CPU processes on a CPU one."""
    kind = env.accelerator_kind if env else None
    if kind is None and env is not None:
        kind = "gpu" if env.backend == "nccl" else "cpu"
    one, many = ("GPU", "GPUs") if kind == "gpu" else ("CPU process", "CPU processes")
    return f"{world} {one if world == 1 else many}"


def _kind(env: PackEnvironment | None) -> str:
    if env is None:
        return "cpu"
    return env.accelerator_kind or ("gpu" if env.backend == "nccl" else "cpu")


def not_comparable(env: PackEnvironment | None, world: int, theirs: str, their_count: int) -> str | None:
    """Why a system of `their_count` accelerators is not comparable with this run, in one line
    ("1 CPU process vs MegaScale's 12,288 GPUs: not comparable (this run has no GPUs)"); None when it is."""
    if _kind(env) != "gpu":
        why = "this run has no GPUs"
    elif world * SCALE_FACTOR < their_count:
        why = f"more than {SCALE_FACTOR}x this run's scale"
    else:
        return None
    return f"{devices(env, world)} vs {theirs}: not comparable ({why})"


def _megascale_line(env: PackEnvironment | None, world: int) -> str | None:
    mega = published()["megascale"]
    why = not_comparable(env, world, f"MegaScale's {mega['gpus']:,} GPUs", mega["gpus"])
    return None if why is None else f"MegaScale: {why}"


def generation(env: PackEnvironment | None) -> str | None:
    """The accelerator generation named in the declared hardware; None on a CPU or an unknown one."""
    if _kind(env) != "gpu":
        return None
    return next((g for g in GENERATIONS if re.search(rf"\b{g}\b", env.hardware, re.IGNORECASE)), None)


def _difference(env: PackEnvironment | None, world: int, model: str) -> str:
    mega = published()["megascale"]
    hardware = env.hardware if env else "undeclared hardware"
    return (f"scale difference: MegaScale {mega['model']} on {mega['gpus']:,} GPUs, this run {model} on "
            f"{devices(env, world)}; hardware: MegaScale's GPUs ({mega['hardware_note']}) against this run's "
            f"{hardware}")


def megascale_reference(row: AblationRow, env: PackEnvironment | None, world: int, model: str) -> str:
    """The MegaScale item matching the arm's category, or a statement that none does."""
    mega = published()["megascale"]
    ranks = re.search(r"\d+", row.scale)
    world = int(ranks.group()) if ranks else world  # the arm's own scale (small arms run fewer ranks)
    if (why := _megascale_line(env, world)) is not None:
        return why
    item = next((i for i in mega["items"] if row.category in i["categories"]), None)
    source = f"{mega['source']}, {mega['url']}"
    if item is None:
        return (f"no item of MegaScale's breakdown matches a {row.category} arm ({source}); "
                + _difference(env, world, model))
    comparison = ExternalComparison(  # R-EVD-3: refused here when the table names no source or scale
        metric="MFU", source=mega["source"], scale_difference=_difference(env, world, model),
        theirs=f"{item['item']} +{item['mfu_points']:.1f} MFU points (absolute, of {mega['baseline_mfu_pct']}% -> "
               f"{mega['mfu_pct']}% overall against {mega['baseline_framework']})",
        ours=f"{row.knob}={row.value}: {row.mfu_change_pct:+.1f}% relative MFU change")
    return (f"MegaScale: {comparison.theirs}; this arm {comparison.ours}, not the same unit or change; "
            f"{comparison.scale_difference}; {mega['breakdown_note']} ({comparison.source}, {mega['url']})")


def annotate(rows: list[AblationRow], env: PackEnvironment | None, world: int, model: str) -> list[AblationRow]:
    """Each row with its `reference` set: the matching published item and the difference stated."""
    return [r.model_copy(update={"reference": megascale_reference(r, env, world, model)}) for r in rows]


def mlperf(env: PackEnvironment | None, world: int) -> MlperfComparison:
    """S7: the shipped MLPerf Training results of the run's hardware generation, those within
    SCALE_FACTOR of the run's GPU count; when none is, the verdict says why in one line."""
    gen = generation(env)
    rows = [MlperfResult.model_validate(r) for r in published()["mlperf_training"]]
    generation_rows = [r for r in rows if gen is not None and r.generation == gen]
    same = [r for r in generation_rows if not_comparable(env, world, "", r.accelerators) is None]
    hardware = env.hardware if env else "undeclared hardware"
    if generation_rows and not same:
        counts = sorted(r.accelerators for r in generation_rows)
        span = f"{counts[0]:,}" + (f" to {counts[-1]:,}" if counts[-1] != counts[0] else "")
        verdict = not_comparable(env, world, f"the same-generation ({gen}) results' {span} accelerators", counts[0])
    elif same:
        verdict = f"{len(same)} same-generation ({gen}) result(s) in the shipped table"
    elif gen:
        verdict = f"{NO_SAME_GENERATION}: no {gen} row in the shipped table (this run used {hardware})"
    else:
        verdict = f"{NO_SAME_GENERATION}: this run used {hardware}, no accelerator generation MLPerf Training covers"
    return MlperfComparison(run_hardware=env.hardware if env else "undeclared", generation=gen, same_generation=same,
                            verdict=verdict, comparable=published()["mlperf_comparable"])


def level(entry: dict[str, Any] | MlperfResult) -> str:
    """A figure's evidence level in words, as a reference line ends."""
    code = entry["level"] if isinstance(entry, dict) else entry.level
    return f"evidence level {code}: {published()['levels'][code]}"


def headline_notes(env: PackEnvironment | None, world: int, model: str, mfu_pct: float | None = None,
                   interruptions_per_day: float | None = None) -> list[str]:
    """The pack's reference lines: MegaScale's headline, the S7 MLPerf line and Llama 3's, each set
    beside this run's measured figure (S2's median MFU, the record's interruption rate) where the run's
    hardware and scale make it comparable, with its source and evidence level; else one line saying why
    not. Reference figures are context, never targets."""
    data = published()
    mega, llama = data["megascale"], data["llama3"]
    comparison = mlperf(env, world)
    notes = [_megascale_line(env, world)]
    if notes[0] is None:
        ours = f"{mfu_pct:.1f}% (S2 median)" if mfu_pct is not None else "not measured"
        headline = ExternalComparison(metric="MFU", ours=f"{ours} on {devices(env, world)}", source=mega["source"],
                                      theirs=f"{mega['mfu_pct']}% against {mega['baseline_mfu_pct']}% for "
                                             f"{mega['baseline_framework']}",
                                      scale_difference=_difference(env, world, model))
        notes = [f"{headline.source} reports MFU {headline.theirs}, communication overlap the largest single item; "
                 f"this run's MFU {headline.ours}; {headline.scale_difference} ({level(mega)}; {mega['url']})"]
    if comparison.same_generation:
        notes += [f"{r.round} ({r.published}), {r.benchmark}: {r.submitter}, {r.accelerators:,} {r.accelerator}, "
                  f"{r.time_to_train_min:g} min time to train; this run: {devices(env, world)}; source: {r.source}, "
                  f"{r.url} ({level(r)})" for r in comparison.same_generation]
    else:
        notes.append(f"MLPerf Training: {comparison.verdict}")
    why = not_comparable(env, world, f"Llama 3's {llama['gpus']:,} {llama['accelerator']} GPUs", llama["gpus"])
    theirs = llama["unexpected_interruptions"] / llama["days"]
    ours = (f"{interruptions_per_day:.1f} a day in this workspace's record" if interruptions_per_day is not None
            else "too few in this workspace's record for a rate")
    notes.append(f"Llama 3: {why}" if why else
                 f"Llama 3 ({llama['source']}) reports {llama['unexpected_interruptions']} unexpected interruptions "
                 f"in {llama['days']} days on {llama['gpus']:,} {llama['accelerator']} ({theirs:.1f} a day) and "
                 f"{llama['ettr_note']}; this run's interruptions: {ours}, on {devices(env, world)}; our drills "
                 f"measure single faults ({level(llama)}; {llama['url']})")
    return notes
