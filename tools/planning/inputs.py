"""What the planners' inputs share: bounds that keep a read-only tool finite whoever fills them
in (people and models alike), and where a plan's restart time comes from (given, or measured by
the workspace's drills and recoveries)."""
from __future__ import annotations

from typing import Literal

from trainops.run_records import RecoveryPath
from trainops.tools.reliability.drill_records import MeasuredRestart, measured_path_restart, newest_node_drill_restart

WEEK_S = 7 * 86400
MONTH_S = 30 * 86400
RestartFrom = Literal["given", "newest_node_drill", "measured_path"]
RESTART_FROM_DOC = ("Where the restart time comes from: 'given' (restart_s), 'newest_node_drill' (measured in the "
                    "newest multi-node drill record of the workspace: detection + isolation + requeue + load), or "
                    "'measured_path' (the median of the workspace's measured recoveries by recovery_path: drill "
                    "records and the trainer's RUN/recoveries.jsonl).")
RECOVERY_PATH_DOC = ("With restart_from='measured_path': the recovery path the job will use (in-process or "
                     "spare-admitted: a lost rank under in-process restart (on by default where the host has a "
                     "GPU per rank), or a lost node when the job also holds spare_nodes; requeue: a lost node "
                     "without spare nodes, the leader's node, or in-process restart off), whose measured restart "
                     "is taken.")


def path_goes_with_measured(restart_from: str, recovery_path: str | None) -> None:
    if (recovery_path is None) == (restart_from == "measured_path"):
        raise ValueError("recovery_path: give it exactly when restart_from='measured_path' (the path whose measured "
                         "restart the plan takes: in-process, spare-admitted or requeue)")


def measured_restart(restart_from: RestartFrom, recovery_path: RecoveryPath | None, tool: str) -> MeasuredRestart:
    """The restart the workspace measured: the newest multi-node drill's, or the median of one recovery path's."""
    if restart_from == "newest_node_drill":
        return newest_node_drill_restart(tool)
    return measured_path_restart(recovery_path, tool)
