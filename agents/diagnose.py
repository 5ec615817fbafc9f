"""The offline policy's diagnosis of a job end: a fixed plan from the request's kind alone (load the fault
skill, read the interruption record and the kind's own reads, grep the failing rank's log, else the job's
status), and a FinalAnswer from the record's structured fields, quoting lines exactly as the tools returned
them: a log's text is only quoted, never chooses a tool. A diagnosis answers a question, so it proposes no
action: what a human might order is written under what to decide next, held to the action policy first.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainops.agents import action_policy
from trainops.agents.answer import Evidence
from trainops.agents.explain import Next, final, grep_evidence, inconclusive, outputs
from trainops.tools.reliability.evidence import NODE_DOWN
from trainops.tools.reliability.next_steps import DETERMINISTIC, NO_REQUEUE
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED

if TYPE_CHECKING:
    from langchain_core.messages import ToolMessage

    from trainops.agents.kinds import Kind
    from trainops.agents.understand import Ambiguity, Request

SKILL = "fault-drill"
ERROR_PATTERN = r"Traceback|Error|Exception|NCCL|timed out|Killed|signal|nan|inf\b|corrupt|checksum"
FALLBACK_LINES = r"falling back|is corrupt|failed verification"
_FINISHED_OK = {"completed", "succeeded", "finished"}


def _record(request: Request, out: dict[str, Any]) -> dict | None:
    """The newest record of the job asked about, or of the run named: never another run's."""
    records = (out.get("list_interruptions") or {}).get("interruptions") or []
    run = None if request.entities.jobs else (request.entities.runs or [None])[0]
    if run:
        records = [r for r in records if Path(str(r.get("run_dir") or "")).name == Path(run).name]
    return records[-1] if records else None


def ask_back(ambiguous: list[Ambiguity]) -> dict[str, Any]:
    """An entity the request names matches several (or none): ask which, listing the candidates."""
    asks = [f"which {a.what} '{a.said}' means: {', '.join(a.candidates) or 'nothing here matches it'}"
            for a in ambiguous]
    return inconclusive("I will not guess: " + "; ".join(asks) + ". Say which one, by its id or a unique part of it.",
                        [f"which {a.what} you mean ({', '.join(a.candidates[:8])})" for a in ambiguous])


def _first_read(reads: tuple[tuple[str, Any, Any], ...], done: dict[str, dict]) -> Next | None:
    """The first declared read not made yet whose condition holds: (tool, its arguments, built only then)."""
    return next(((tool, args()) for tool, when, args in reads if when and tool not in done), None)


def plan(kind: Kind, request: Request, done: dict[str, dict], results: list[ToolMessage],
         schemas: dict[str, dict]) -> Next:
    """The next read of the declared plan; once a kind's own read is done, its answer; else the record's."""
    found, out = request.entities, outputs(results)
    job, run, record = (found.jobs or [None])[0], (found.runs or [None])[0], _record(request, out)
    if record is None and job is None and run and "list_jobs" in done:  # a run named, no record: its job
        jobs = [j for j in out.get("list_jobs", {}).get("jobs") or [] if Path(str(j.get("run_dir") or "")).name
                == Path(run).name]
        job = str(jobs[-1]["job_id"]) if jobs else None
    target, ev = run or (record or {}).get("run_dir"), (record or {}).get("evidence") or {}
    rank = ev.get("failing_rank") if (record or {}).get("run_dir") else None
    if any(step in done for step in kind.steps):
        return kind.answer(request, out)
    bitflip = record is not None and record.get("fault_kind") == "bitflip" and record.get("run_dir")
    call = _first_read((
        ("load_skill", "load_skill" in schemas, lambda: {"name": SKILL}),
        ("list_interruptions", True, lambda: {"job_id": str(job)} if job else {}),
        *((step, step in schemas and target, lambda: {"run": Path(str(target)).name}) for step in kind.steps),
        ("grep_log", record is not None and "grep_log" in schemas, lambda: {
            "job_id": record["job_id"], "scheduler": record.get("scheduler") or "local", "pattern": ERROR_PATTERN,
            "max_matches": 5, "max_bytes": 4000, **({} if rank is None else {"rank": rank})}),
        ("list_jobs", record is None and job is None and run, lambda: found.scheduler_arg),
        ("job_status", record is None and job, lambda: {"job_id": str(job), **found.scheduler_arg}),
        ("sdc_case", bitflip and "sdc_case" in schemas and not (kind.answer and not kind.steps),
         lambda: {"run": Path(str(record["run_dir"])).name})), done)
    if call or record is not None and kind.answer and not kind.steps:
        return call or kind.answer(request, out)
    checked = _known_answers(out.get("sdc_case"), results) if "sdc_case" in done else None
    if checked and isinstance(checked[0], str):  # a check job's log still to read
        return checked
    return (_from_record(record, grep_of(results, record["job_id"]), "why" in request.concepts, checked) if record
            else _without_record(job or run, out))


def checkpoints(kind: Kind, request: Request, done: dict[str, dict], results: list[ToolMessage],
                schemas: dict[str, dict]) -> Next:
    """Which checkpoint the run's latest start loaded (list_checkpoints' journal): the corrupt ones it skipped
    are quoted with their reasons and, when a job is named, the job log's fallback line; never followed."""
    found, out = request.entities, outputs(results)
    if not found.runs:
        return inconclusive("The request names no run, and a run's checkpoint journal is what says which "
                            "checkpoint it loaded.", ["the run id (list_jobs shows each job's run folder)"])
    run, starts = found.runs[0], out.get("list_checkpoints", {}).get("starts") or []
    skipped = [s for start in starts for s in start.get("skipped") or []]
    call = _first_read((
        ("list_checkpoints", True, lambda: {"run": run}),
        ("grep_log", skipped and found.jobs, lambda: {"job_id": found.jobs[0], **found.scheduler_arg,
                                                      "pattern": FALLBACK_LINES, "max_matches": 3, "max_bytes": 2000})),
        done)
    if call or "list_checkpoints" not in out:
        return call or inconclusive(f"list_checkpoints could not read run {run}'s checkpoints.",
                                    ["the run's folder name under $TRAINOPS_HOME/runs"])
    newest = out["list_checkpoints"].get("newest_committed_step")
    if not starts:
        return final("answered", f"Run {run} has not started from a checkpoint: its journal records no load. Its "
                                 f"newest committed checkpoint is step {newest}, which a resume would verify and load.",
                     evidence=[Evidence(source="list_checkpoints:newest_committed_step", quote=str(newest))])
    last = starts[-1]
    evidence = [Evidence(source="list_checkpoints:starts.loaded", quote=str(last["loaded"]))]
    evidence += [Evidence(source="list_checkpoints:starts.skipped.reason", quote=str(s["reason"])) for s in skipped]
    evidence += grep_evidence(out.get("grep_log"))
    summary = (f"The latest start of run {run} loaded the checkpoint of step {last['loaded_step']}"
               + (" (verified against its commit record)" if last.get("verified") else "") + ".")
    if not skipped:
        return final("answered", summary + " No checkpoint failed verification on the way.", evidence=evidence)
    summary += " It did not load a newer one because verification failed: " + "; ".join(
        f"step {s['step']}: {s['reason']}" for s in skipped) + "."
    return final("diagnosed", summary, "high", fault_kind="checkpoint-corruption", evidence=evidence,
                 next_to_collect=["a human decides whether to quarantine the corrupt checkpoint(s) "
                                  f"{sorted({s['step'] for s in skipped})} (quarantine_checkpoints, gated)"])


def grep_of(results: list[ToolMessage], job_id: str) -> dict | None:
    """The grep_log result of `job_id`'s own log (not a check job's)."""
    return next((r.artifact for r in results if r.name == "grep_log" and r.status == "success"
                 and isinstance(r.artifact, dict) and str(r.artifact.get("source", "")).startswith(f"job {job_id}")),
                None)


def _known_answers(case: dict | None, results: list[ToolMessage]) -> Next | tuple[list[str], list[Evidence]] | None:
    """After a suspected SDC: grep each check job that convicted a node for its failure line, once; then (the
    nodes convicted, those lines as evidence); None when none was."""
    checks = [c for c in ((case or {}).get("fleet"), (case or {}).get("colocated"))
              if c and c.get("job_id") and c.get("failed_nodes")]
    if unread := [c["job_id"] for c in checks if grep_of(results, c["job_id"]) is None]:
        return "grep_log", {"job_id": unread[0], "pattern": re.escape(KNOWN_ANSWER_FAILED), "max_matches": 3,
                            "max_bytes": 2000}
    return (sorted({node for c in checks for node in c["failed_nodes"]}),
            [e for c in checks for e in grep_evidence(grep_of(results, c["job_id"]))]) if checks else None


def straggler(request: Request, out: dict[str, Any]) -> dict[str, Any]:
    found, subject = out.get("find_straggler"), (request.entities.jobs or request.entities.runs or [None])[0]
    if not found:
        return inconclusive(f"find_straggler could not judge {subject}'s ranks.",
                            ["query_metrics step_time_s per rank over the run", "watch_job while the job runs"])
    medians = ", ".join(f"rank {r} {m:.4f} s" for r, m in found.get("rank_medians_s", {}).items())
    cited = [Evidence(source="find_straggler:reason", quote=str(found["reason"]))]
    if found.get("straggler") is None:
        return final("healthy", f"No straggler in {found['run']}: {found['reason']} ({medians}).", evidence=cited)
    rank, node = int(found["straggler"]), found.get("node")
    return final("diagnosed", f"Rank {rank}" + (f" on {node}" if node else "") + f" is the straggler of "
                 f"{found['run']}: {found['reason']} (median {found['field']}: {medians}).",
                 fault_kind="straggler", ranks=[rank], nodes=[node] if node else [], evidence=cited)


def time_lost(request: Request, out: dict[str, Any]) -> dict[str, Any]:
    record = _record(request, out) or {}
    lost, parts = record.get("time_lost_s"), record.get("lost") or {}
    phases = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in parts.items() if isinstance(v, (int, float)))
    return final("answered", f"Job {record.get('job_id')} lost {lost} s of training to that end"
                 + (f" ({phases})" if phases else "") + f" and {record.get('steps_lost', 0)} step(s) redone; the "
                 "interruption record's effective_training_time sets it against the window.",
                 evidence=[Evidence(source="list_interruptions:time_lost_s", quote=str(lost))])


def symptom(request: Request, out: dict[str, Any]) -> dict[str, Any]:
    """A symptom naming no job or run: what the workspace holds, and what would settle it, never a guessed cause."""
    jobs = (out.get("list_jobs") or {}).get("jobs") or []
    ends = (out.get("list_interruptions") or {}).get("interruptions") or []
    seen = [Evidence(source="list_jobs:job_id", quote=str(j["job_id"])) for j in jobs[-3:]
            if len(str(j["job_id"])) >= 3]
    seen += [Evidence(source="list_interruptions:cause_reason", quote=str(e["cause_reason"])) for e in ends[-2:]]
    summary = (f"The request names no job or run. The scheduler knows {len(jobs)} job(s) and the interruption "
               f"record holds {len(ends)} bad end(s); nothing here says which job is slow, or that any is.")
    return inconclusive(summary, [
        "the slow job's or run's id, to read its record, logs and metrics",
        "a baseline on this cluster (trainops baseline) to hold step time and MFU against",
        "compare_runs between the slow run and a run from before it seemed slow",
        "the environment declaration (trainops env): hardware, interconnect, versions"], seen)


def _decisions(record: dict, kind: str | None) -> list[str]:
    """What a human might order next (a fixed cause -> action mapping), as advice, never a proposed call; an
    order the policy would refuse says who decides instead. Only nodes the scheduler itself marks down are
    drained, never a host a log names."""
    ev, cause, job = record.get("evidence") or {}, record.get("cause"), record["job_id"]
    down = sorted(node for node, state in (ev.get("node_states") or {}).items() if NODE_DOWN.search(str(state)))
    notes = [f"next step for a {cause} cause: {record['next_step']}"] if record.get("next_step") else []
    orders: list[tuple[str, dict[str, Any], str]] = []
    if kind == "bitflip":
        orders.append(("respond_to_sdc", {"job_id": job}, "replica checksums disagree: suspected silent data "
                                                          "corruption (R-ESC-3)"))
    elif cause == "hardware" and record.get("sub_cause") == "node-failure" and down:
        orders += [("drain_node", {"node": node}, f"the scheduler marks the job's node {node} down") for node in down]
    elif cause == "hardware" and ev.get("failing_node"):
        notes.append(f"node {ev['failing_node']}: a hardware fault suspected from the job's own log; run the node "
                     "check first")
    if record.get("requeue_helps") is True and not ev.get("requeued"):  # the cause class's (next_steps.py)
        healthy = " on healthy nodes" if cause in ("hardware", "network") else ""
        orders.append(("requeue_job", {"job_id": job}, f"resume from the newest good checkpoint{healthy}"))
    elif record.get("requeue_helps") is False and cause in DETERMINISTIC:
        notes.append(NO_REQUEUE)
    if ev.get("requeued"):  # the scheduler's accounting: the job already ran again after this end
        notes.append("the scheduler already requeued the job after this end: there is no requeue left to order")
    for tool, args, why in orders:
        reason = action_policy.refusal(tool, {**args, "scheduler": record.get("scheduler") or "local"})
        target = ", ".join(f"{k} {v}" for k, v in args.items())
        notes.append(f"a human decides instead of {tool}: {reason}" if reason else
                     f"a human may order {tool} ({target}): {why}")
    return notes


def _from_record(record: dict, grep: dict | None, asks_cause: bool,
                 checked: tuple[list[str], list[Evidence]] | None = None) -> dict[str, Any]:
    """The fault's kind and place even when unclassified; its cause only when the classifier named one.
    `checked`: the nodes known-answer checks convicted after a suspected SDC, and their lines."""
    ev, cause, kind = record.get("evidence") or {}, record.get("cause"), record.get("fault_kind")
    evidence = [Evidence(source=f"list_interruptions:{record['id']} cause_reason", quote=str(record["cause_reason"]))]
    if ev.get("signal"):
        evidence.append(Evidence(source="list_interruptions:evidence.signal", quote=str(ev["signal"])))
    evidence += [Evidence(source="list_interruptions:evidence.error_lines", quote=line)
                 for line in (ev.get("error_lines") or [])[:2] if line.strip()]
    evidence += grep_evidence(grep) + (checked[1] if checked else [])
    ranks = sorted({r for r in [ev.get("failing_rank"), *(ev.get("silent_ranks") or [])] if r is not None})
    nodes = checked[0] if checked else [ev["failing_node"]] if ev.get("failing_node") else []
    if cause == "unclassified" and (asks_cause or kind is None or not ranks):
        return final("inconclusive", f"Job {record['job_id']} ended and the evidence does not settle the cause: "
                                     f"{record['cause_reason']}", "low", fault_kind=kind, ranks=ranks, nodes=nodes,
                     evidence=evidence, next_to_collect=[
                         "the failing rank's full log around its last step (read_log_window)",
                         "the node's kernel log and the scheduler's node state at the end",
                         "what changed since the job's last good run (its config, data, code, image: compare_runs)"])
    return final("diagnosed", f"Job {record['job_id']} ended with a {cause} cause" + (f" ({kind})" if kind else "")
                 + f": {record['cause_reason']}",
                 record.get("confidence") or ("high" if len(evidence) > 1 else "medium"), fault_kind=kind,
                 cause_class=cause, ranks=ranks, nodes=nodes, evidence=evidence,
                 next_to_collect=_decisions(record, kind))


def _without_record(subject: str, out: dict[str, Any]) -> dict[str, Any]:
    state = str((out.get("job_status") or {}).get("state") or "")
    seen = [Evidence(source="job_status:state", quote=state)] if state else []
    if state.lower() in _FINISHED_OK:
        return final("healthy", f"Job {subject} finished ({state}) and the interruption record holds no bad end "
                                "for it.", evidence=seen)
    said = f"; its state is {state}" if state else ""
    return inconclusive(f"The interruption record holds no end of {subject}{said}.",
                        ["watch_job on the job while it runs, for heartbeat stalls and fired rules",
                         "grep_log on each rank's log for errors"], seen)
