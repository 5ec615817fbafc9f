"""Score the diagnosis of each replayed case (replay.py) and publish per class in RESULTS.md.

`python -m trainops.benchmarks.diagnosis.score` replays every case in a fresh workspace, reads
each end's interruption record and the offline agent's answer built from it (what `trainops ask
"why did JOB die"` answers, without its log grep), and rewrites its section of RESULTS.md.

A case's class (cases/README.md) maps onto trainops' causes (tools/reliability/causes.py):
  hung-peer -> hung-peer; network -> network; gpu-hardware -> hardware; gpu-memory -> gpu-memory;
  host-memory -> host-memory; storage -> storage; configuration -> configuration;
  numerics-data -> data; scheduler -> planned (a preemption, a time limit, a requeue: the
  scheduler's planned end, not a fault of the job); software -> software.
The "coarse" column also accepts "software" for gpu-memory, host-memory, storage and
configuration (the cause set before those had their own names).

Per case: right (the cause the class maps to), wrong (another cause), unclassified; wrong at
"high" (the answer's confidence); an unjustified action (a requeue offered where the thread says
a requeue cannot help); and whether the record quotes the line that names the problem."""
from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from trainops.agents import diagnose
from trainops.benchmarks.diagnosis.replay import CASES, Case, load_cases, replay
from trainops.benchmarks.harness import write_section
from trainops.tools.context import operator_session
from trainops.tools.reliability.interruptions import Interruption

BEGIN, END = "<!-- diagnosis:begin -->", "<!-- diagnosis:end -->"
CLASS_TO_CAUSE: dict[str, str] = {
    "hung-peer": "hung-peer", "network": "network", "gpu-hardware": "hardware", "gpu-memory": "gpu-memory",
    "host-memory": "host-memory", "storage": "storage", "configuration": "configuration",
    "numerics-data": "data", "scheduler": "planned", "software": "software",
}
COARSE = {"gpu-memory", "host-memory", "storage", "configuration"}
"""Classes whose cause the coarse view also accepts as "software"."""


@dataclass
class Scored:
    case: Case
    cause: str
    confidence: str
    requeue_offered: bool
    quoted: bool
    reason: str

    @property
    def expected(self) -> str:
        return CLASS_TO_CAUSE[self.case.cause_class]

    @property
    def outcome(self) -> str:
        return "right" if self.cause == self.expected else "unclassified" if self.cause == "unclassified" else "wrong"

    @property
    def coarse_right(self) -> bool:
        return self.outcome == "right" or (self.case.cause_class in COARSE and self.cause == "software")

    @property
    def unjustified(self) -> bool:
        return self.requeue_offered and not self.case.requeue_helps


def quotes_naming_line(case: Case, record: Interruption) -> bool:
    """The record quotes the line that names the problem (its first 100 characters, as posted)."""
    want = case.naming_line.strip()[:100]
    quoted = " ".join([record.cause_reason, getattr(record, "quote", "") or ""])
    return want in quoted


_REQUEUE_WORD = re.compile(r"\brequeue(?:s|d|ing)?\b(?!_job)", re.I)
_NOT_A_REQUEUE = re.compile(r"\ba requeue (?:waits|repeats|meets|cannot|can't|won't|will not|does not|doesn't|"
                            r"would not|helps? nothing)\b|\bno requeue\b", re.I)


def recommends_requeue(lines: list[str], requeue_helps: bool) -> bool:
    """The answer offers a requeue: a human may order requeue_job, or (where the case's thread says a
    requeue cannot help) any next-step line that tells the reader to requeue, a conditional one too
    ('requeue once the link is healthy'); a line saying a requeue will not help is not one."""
    if any("requeue_job" in line and "a human may order" in line for line in lines):
        return True
    if requeue_helps:
        return False
    return any(_REQUEUE_WORD.search(_NOT_A_REQUEUE.sub("", line)) for line in lines
               if not line.startswith("a human decides instead of"))


def score(case: Case, record: Interruption | None) -> Scored:
    if record is None:
        return Scored(case, "no record", "", False, False, "trainops saw a clean finish")
    answer = diagnose._from_record(record.model_dump(mode="json"), None, True)
    offered = recommends_requeue(answer.get("next_to_collect", []), case.requeue_helps)
    return Scored(case, record.cause, answer.get("confidence", ""), offered, quotes_naming_line(case, record),
                  record.cause_reason)


def run_all(cases: list[Case]) -> list[Scored]:
    with tempfile.TemporaryDirectory(prefix="trainops-diagnosis-") as tmp:
        old = os.environ.get("TRAINOPS_HOME")
        os.environ["TRAINOPS_HOME"] = str(Path(tmp) / "ws")
        try:
            with operator_session():
                return [score(case, replay(case)) for case in cases]
        finally:
            if old is None:
                os.environ.pop("TRAINOPS_HOME", None)
            else:
                os.environ["TRAINOPS_HOME"] = old


def table(scored: list[Scored]) -> list[str]:
    """One row per class and a total: right, wrong, unclassified, coarse right, wrong at high,
    unjustified requeues, naming line quoted."""
    lines = ["| class | cases | right | wrong | unclassified | right (coarse) | wrong at high | unjustified requeue "
             "| naming line quoted |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        groups.setdefault(s.case.cause_class, []).append(s)
    for name, rows in [*sorted(groups.items()), ("**all**", scored)]:
        n = Counter(s.outcome for s in rows)
        lines.append(f"| {name} | {len(rows)} | {n['right']} | {n['wrong']} | {n['unclassified']} | "
                     f"{sum(s.coarse_right for s in rows)} | "
                     f"{sum(s.outcome == 'wrong' and s.confidence == 'high' for s in rows)} | "
                     f"{sum(s.unjustified for s in rows)} | {sum(s.quoted for s in rows)} |")
    return lines


def details(scored: list[Scored]) -> list[str]:
    lines = ["| case | class | got | confidence | requeue offered | quoted |", "|---|---|---|---|---|---|"]
    for s in scored:
        lines.append(f"| `{s.case.slug}` | {s.case.cause_class} | {s.cause} | {s.confidence or '-'} | "
                     f"{'yes' if s.requeue_offered else 'no'} | {'yes' if s.quoted else 'no'} |")
    return lines


def markers(folder: Path) -> tuple[str, str]:
    """RESULTS.md's section for a case set: the first set keeps its own, each further set gets one."""
    return (BEGIN, END) if folder == CASES else (f"<!-- diagnosis:{folder.name}:begin -->",
                                                 f"<!-- diagnosis:{folder.name}:end -->")


def render(scored: list[Scored], label: str, folder: Path = CASES) -> str:
    begin, end = markers(folder)
    where = folder.relative_to(CASES.parents[2]) if folder.is_relative_to(CASES.parents[2]) else folder
    title = "real failure logs" if folder == CASES else f"real failure logs, set {folder.name}"
    body = [begin, f"## Diagnosis on {title} (`python -m trainops.benchmarks.diagnosis.score`)", "",
            f"{label} {len(scored)} frozen cases from public threads ({where}), each replayed "
            "through submit_job on the local scheduler; scored on the interruption record and the offline "
            "agent's answer from it (benchmarks/diagnosis/score.py says how).", "", *table(scored), "",
            "<details><summary>per case</summary>", "", *details(scored), "", "</details>", end]
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=[], help="Only these slugs (repeatable).")
    parser.add_argument("--label", default="Measured on", help="The line that opens the section.")
    parser.add_argument("--no-write", action="store_true", help="Print the tables; leave RESULTS.md alone.")
    parser.add_argument("--set", type=Path, default=CASES, dest="folder",
                        help="The case set's folder (default: benchmarks/diagnosis/cases, retired; a fresh one beside "
                             "it, e.g. benchmarks/diagnosis/fresh-2026-12-07).")
    args = parser.parse_args(argv)
    folder = args.folder.resolve()
    cases = [c for c in load_cases(folder) if not args.case or c.slug in args.case]
    scored = run_all(cases)
    print("\n".join(table(scored) + [""] + details(scored)))
    if not args.no_write:
        print(write_section(render(scored, args.label, folder), *markers(folder)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
