"""Evidence rows show when each figure was measured, as a start~end window, not a duration
(issue 24, item 8); the SOP's checkpoint plan in the report carries its write-bandwidth occupancy."""
from __future__ import annotations

import calendar

from trainops.skills.evidence.model import CheckpointPlan, EvidenceRow
from trainops.skills.evidence.pack import assemble
from trainops.skills.evidence.render import to_html, to_markdown
from trainops.workspace import runs_dir


def _pack(factories, rows, plan=None):
    run = factories.write_run(runs_dir() / "base-1")
    return assemble("pack-w", factories.environment(), factories.baseline([str(run)]), [factories.ablation()],
                    [factories.drill()], rows, checkpoint_plan=plan)


def test_an_evidence_row_renders_its_start_and_end_time(factories):
    start = calendar.timegm((2026, 12, 2, 1, 40, 9))
    row = EvidenceRow(tool="submit_job", version="0.1.0", command="trainops train", log_path="runs/r/log.txt",
                      value="MFU 2.0%", window_start=start, window_end=start + 12.4)
    pack = _pack(factories, [row])
    markdown = to_markdown(pack)
    assert "2026-12-02 01:40:09\\~01:40:21 UTC" in markdown and "12.4 s" not in markdown  # ~ escaped in Markdown
    assert "2026-12-02 01:40:09~01:40:21 UTC" in to_html(pack)


def test_a_window_over_midnight_names_both_dates(factories):
    start = calendar.timegm((2026, 12, 1, 23, 59, 50))
    row = EvidenceRow(tool="t", version="1", command="c", log_path="l", value="v", window_start=start,
                      window_end=start + 20)
    assert "2026-12-01 23:59:50\\~2026-12-02 00:00:10 UTC" in to_markdown(_pack(factories, [row]))


def test_the_checkpoint_plan_in_the_report_states_its_write_bandwidth_occupancy(factories):
    plan = CheckpointPlan(save_stall_s=0.2, write_s=0.3, restart_s=5.0, mtbf_h=24, mtbf_basis="declared",
                          young_interval_min=4.0, daly_interval_min=4.2, expected_waste_pct=1.0,
                          recommendation="checkpoint every 4.2 min", checkpoint_bytes=3 * 2**20,
                          write_bandwidth_mib_s=10.0, write_occupancy_pct=0.119)
    markdown = to_markdown(_pack(factories, [], plan))
    assert ("Write-bandwidth occupancy.** 3.0 MiB per checkpoint at the measured checkpoint write bandwidth "
            "10.0 MiB/s, once per 4.2 min: the checkpoints occupy 0.119% of the write bandwidth") in markdown
