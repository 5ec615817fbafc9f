"""The model advises, this policy acts: every call the agent makes and every action its answer proposes
passes `refusal` first, with limits a model's words cannot move (constants, and the interruption record
trainops writes). A job may be requeued after at most MAX_RESTARTS ends in RESTART_WINDOW_S, and never over
a suspected silent data corruption (R-ESC-3); past that a human decides. The gate holds the rest (R-SEC-4).
"""
from __future__ import annotations

import time
from typing import Any

from trainops.tools.reliability.interruptions import read_interruptions

MAX_RESTARTS = 3
RESTART_WINDOW_S = 24 * 3600.0
RESTART_TOOLS = frozenset({"requeue_job"})


def refusal(tool: str, args: dict[str, Any], now: float | None = None) -> str | None:
    """Why the policy refuses this call (a reason naming the limit and who decides instead), or None."""
    job_id = args.get("job_id")
    if tool not in RESTART_TOOLS or not isinstance(job_id, str) or not job_id:
        return None  # not a restart, or no job_id: the tool's own input validation names it
    now = time.time() if now is None else now
    ends = [r for r in read_interruptions(job_id) if not r.planned and now - r.time <= RESTART_WINDOW_S]
    if len(ends) > MAX_RESTARTS:
        return (f"restart budget spent: job {job_id} ended {len(ends)} times in the last "
                f"{RESTART_WINDOW_S / 3600:g} h (the policy allows {MAX_RESTARTS} restarts); a human decides: "
                "report the causes and escalate instead of restarting")
    if ends and ends[-1].evidence.checksum_verdict == "disagree":
        return (f"no restart of job {job_id} over a suspected silent data corruption (R-ESC-3: replica checksums "
                "disagree): call respond_to_sdc and hand the case to a human")
    return None

