"""A silent-data-corruption case as the SDC response (skills/sdc.py) hands it to a human: its
record, RUN/sdc-case.json, written whole and bound to the audit log, and read back only when its
bytes are the ones trainops wrote. Here, below the skills, so the pack's hand-over
(skills/escalate.py, which the response itself uses) can carry a case without importing the response."""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from trainops.run_folder import read_regular
from trainops.tools.governance.escalation import Escalation
from trainops.tools.governance.written import unbound, write_bound
from trainops.tools.reliability.sdc_check import NodeResult

CASE_FILE = "sdc-case.json"
"""RUN/sdc-case.json: the case as handed to the human."""
CASE_KIND = "sdc_case_written"
"""The audit entry binding a case file to the bytes `respond` wrote (tools/governance/written.py): a case
a job or another workspace writer edited, or one copied in, is not read as trainops' answer."""


class Suspect(BaseModel):
    rank: int
    node: str | None
    step: int = Field(ge=0)
    evidence: str

    @classmethod
    def of(cls, detection) -> "Suspect":
        """The suspect a detect_faults checksum mismatch names."""
        return cls(rank=detection.rank, node=detection.node, step=int(detection.step), evidence=detection.evidence)


class CheckRun(BaseModel):
    """One known-answer check job and what each node gave."""
    kind: str = Field(description="fleet or colocated")
    job_id: str = ""
    nodes: list[str]
    state: str = ""
    results: list[NodeResult] = Field(default_factory=list)
    failed_nodes: list[str] = Field(default_factory=list, description="Nodes with a wrong answer or no answer.")
    note: str = ""

    def line(self) -> str:
        if not self.job_id:
            return f"{self.kind} test not run: {self.note}"
        return (f"{self.kind} test job {self.job_id} on {', '.join(self.nodes)}: {self.state}; failed: "
                f"{', '.join(self.failed_nodes) or 'none'}"
                + "".join(f"; {r.host} GEMM {r.gemm_wrong_elements} wrong element(s), collective "
                          f"{'ok' if r.collective_ok else 'wrong'}" for r in self.results if not r.ok)
                + (f"; {self.note}" if self.note else ""))


class SdcCase(BaseModel):
    run_dir: str
    suspect: Suspect
    quarantined: list[int]
    fleet: CheckRun
    colocated: CheckRun
    drained: list[str]
    escalation: Escalation
    pending_id: str | None = Field(description="The pending approval that hands the case to a human.")


def case_key(run_dir: str | Path) -> str:
    """The name a run's case is bound under: its folder, resolved."""
    return str(Path(run_dir).resolve())


def write_case(case: SdcCase) -> Path:
    """RUN/sdc-case.json written whole and bound to the audit log."""
    data = (case.model_dump_json(indent=2) + "\n").encode()
    return write_bound(Path(case.run_dir) / CASE_FILE, CASE_KIND, case_key(case.run_dir), data)


def case_problem(run_dir: str | Path, data: bytes) -> str | None:
    """Why `data` is not the case trainops last wrote for this run (edited, or made by hand), or None."""
    return unbound(CASE_KIND, case_key(run_dir), data)


def read_case(run_dir: str | Path) -> SdcCase | None:
    """The run's case as trainops wrote it; None where there is none, or where the file is not the one
    trainops last wrote (a job can write its run folder), or does not read as a case."""
    raw = read_regular(Path(run_dir) / CASE_FILE)
    if raw is None or case_problem(run_dir, raw) is not None:
        return None
    try:
        return SdcCase.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None
