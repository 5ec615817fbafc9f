"""One definition per figure (issue 39, item 2): the pack carries a figures table, each figure with
its name, value, unit, definition, how it was obtained and its evidence level, computed once when
the pack is assembled; the report's sections quote it, so a figure name has one value wherever it
appears. Quantities that differ have two names: communication time against exposed communication,
a real checkpoint's write bandwidth against the storage probe's."""
from __future__ import annotations

import json
import re

from trainops.skills.evidence import plots
from trainops.skills.evidence.bottleneck import BottleneckSplit, RankTiming, TimeShare
from trainops.skills.evidence.model import CheckpointPlan
from trainops.skills.evidence.pack import assemble, derivation_problems, load, write
from trainops.skills.evidence.render import to_markdown
from trainops.workspace import runs_dir

LEVELS = {"measured", "derived", "declared", "assumed default"}


def _split(run: str) -> BottleneckSplit:
    def share(seconds: float, pct: float) -> TimeShare:
        return TimeShare(seconds=seconds, share_pct=pct, method="measured in the test")
    return BottleneckSplit(wall_time_s=100.0, compute=share(3.0, 3.0), communication=share(2.4, 2.4),
                           data_loading=share(1.0, 1.0), scheduling=share(0.2, 0.2), startup=share(93.3, 93.3),
                           remainder=share(0.3, 0.3), queue_wait_s=0.2, idle_allocated_s=93.3,
                           layout={"dp": 2, "tp": 1, "pp": 1}, ranks_run=run,
                           ranks=[RankTiming(rank=0, dp=0, tp=0, pp=0, step_time_median_s=0.1,
                                             exposed_comm_share_pct=55.0),
                                  RankTiming(rank=1, dp=1, tp=0, pp=0, step_time_median_s=0.1,
                                             exposed_comm_share_pct=20.0)])


def _pack(factories, drill_record: str = "runs/drill-1/drill.json"):
    run = str(factories.write_run(runs_dir() / "base-1"))
    base = factories.baseline([run]).model_copy(update={
        "comm_share_pct": 28.7, "comm_share_method": "torch.profiler traces of base-1 (2 rank(s))",
        "exposed_comm_share_pct": 17.4, "bottleneck": _split(run)})
    env = factories.environment().model_copy(update={"checkpoint_write_gib_per_s": 0.925})
    plan = CheckpointPlan(save_stall_s=0.2, write_s=0.3, restart_s=5.0, mtbf_h=24, mtbf_basis="assumed default",
                          young_interval_min=4.0, daly_interval_min=4.2, expected_waste_pct=0.1412,
                          recommendation="checkpoint every 4.2 min", checkpoint_bytes=3 * 2**20,
                          write_bandwidth_mib_s=21.4, write_occupancy_pct=0.119)
    drill = factories.drill().model_copy(update={"drill_record": drill_record})
    return assemble("pack-f", env, base, [factories.ablation()], [drill], [], checkpoint_plan=plan)


def _figures_table(markdown: str) -> dict[str, list[str]]:
    """The Figures section's table, row by row: name -> the other cells."""
    section = markdown.split("## Figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    cells = [[re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return {c[0]: c[1:] for c in cells}


def test_the_pack_carries_a_figures_table_with_every_field_and_an_evidence_level(factories):
    pack = _pack(factories)
    names = [f.name for f in pack.figures]
    assert len(names) == len(set(names)), names
    for figure in pack.figures:
        assert figure.definition and figure.method and figure.unit and figure.level in LEVELS, figure
    assert json.loads(pack.model_dump_json())["figures"][0]["definition"]  # the agent reads it from the JSON


def test_communication_time_and_exposed_communication_are_two_figures_defined_apart(factories):
    figures = {f.name: f for f in _pack(factories).figures}
    time, exposed = figures["communication time"], figures["exposed communication"]
    assert (time.value, exposed.value) == (28.7, 17.4)
    assert time.definition != exposed.definition and "compute" in exposed.definition


def test_a_checkpoints_write_bandwidth_and_the_storage_probes_are_two_figures_in_one_unit(factories):
    figures = {f.name: f for f in _pack(factories).figures}
    drill, probe = figures["checkpoint write bandwidth"], figures["storage probe write bandwidth"]
    assert (drill.unit, probe.unit) == ("MiB/s", "MiB/s")
    assert drill.value == 21.4 and round(probe.value, 1) == 947.2
    assert "probe" in probe.definition and "probe" not in drill.definition


def test_each_figure_name_in_the_report_has_one_value_and_one_definition(factories):
    pack = _pack(factories)
    markdown = to_markdown(pack, plots.all_plots(pack))
    table = _figures_table(markdown)
    assert set(table) == {f.name for f in pack.figures}
    body = markdown.replace(markdown.split("## Figures", 1)[1].split("\n## ", 1)[0], "")
    for figure in pack.figures:
        value, level, definition = table[figure.name][:3]
        assert value == figure.shown and level == figure.level and definition, figure.name
        number = re.escape(figure.shown.split()[0].rstrip("%"))
        for found in re.finditer(rf"(?<![\w-]){re.escape(figure.name)}[^\d|\n]{{0,4}}(-?[\d,.]*\d)", body,
                                 re.IGNORECASE):
            assert re.fullmatch(number, found.group(1)), (figure.name, found.group(0), figure.shown)
    for old in ("Communication share:", "| checkpoint write |", "0.925 GiB/s", "0.1%"):
        assert old not in markdown, old
    for quoted in ("communication time 28.7%", "exposed communication 17.4%", "checkpoint write bandwidth 21.4 MiB/s",
                   "storage probe write bandwidth 947.2 MiB/s", "expected waste 0.14%"):
        assert quoted.lower() in markdown.lower(), quoted


def test_a_figure_edited_in_evidence_json_is_refused_at_approval(factories, tmp_path):
    record = tmp_path / "drill.json"
    record.write_text("{}")
    folder = write(_pack(factories, str(record)), tmp_path / "packs")
    pack = load(folder)
    edited = pack.model_copy(update={"figures": [pack.figures[0].model_copy(update={"value": 1.0}),
                                                 *pack.figures[1:]]})
    assert not [p for p in derivation_problems(pack, folder) if "figures table" in p]
    assert any("figures table is not the one its measurements give" in p
               for p in derivation_problems(edited, folder))
