"""The cause a job end's evidence supports (tools/reliability/evidence.py gathers it), by rules over
that evidence alone, with how sure it is, the line that names it, the next step and whether a plain
requeue can help (`diagnose`; `classify` is its cause and reason). A drill's name and the
faults.jsonl kind are never read: that a fault was injected comes from trainops' own record of the
injection (tools/reliability/interruptions.py), and the evidence's own reading is kept beside it.
Whether a requeue can help is never a rule's own say: it is the cause class's (next_steps.py).

The rules, first match wins:
- an operator's cancel of a healthy job -> planned (preemption or time limit where the scheduler's own
  state says so: Slurm calls a preempted job cancelled too);
- replica checksums disagree at one step -> hardware (suspected silent data corruption, medium: the run's
  own metrics; the known-answer checks trainops runs settle it);
- a node the scheduler calls down / not responding whose ranks were still running -> network
  (unreachable, not dead: a partition);
- processes ended (SIGKILL, or no word) with their node down / not responding -> hardware;
- the kernel's OOM killer ended a rank -> host-memory;
- a NaN/inf loss at a step that recurs when a later launch replays that step -> data;
- a declared failure signature (tools/reliability/signatures.py) specific enough to name a cause,
  the most specific first, other than a collective timeout -> its cause;
  a scheduler's end line in the job's output that the log goes on past with the job's own failure
  offers no requeue (that failure ends the next run too);
- a rank gone without an exit note while its peers ran on a live node -> its peers' connection
  errors are consequences; nothing says what killed it -> unclassified, stating what was seen;
- a rank's heartbeat stalled while its process lived on a live node -> hung-peer, naming that rank;
- a collective timeout (no network evidence outranked it) -> hung-peer, naming the rank that did
  not arrive when the log's ranks say which;
- connection resets / refusals between live nodes -> network;
- a NaN/inf that did not recur on replay -> not the data there: unclassified, stating it;
- a class hint (a less specific signature) -> its cause, at low confidence;
- a Python exception in a rank or the run's failure line (not the launcher's report of a
  child's failure) -> software;
- the known-answer check's failure line in the job's own output -> unclassified, the line quoted:
  any job can print it; only the check job trainops ran and read (skills/sdc.py) convicts a node;
- otherwise unclassified with what was seen and what to collect.
"high" confidence only for a specific signature (or trainops' own witnessed evidence) that no
other specific line contradicts; the contradicting causes are listed as alternatives."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from trainops.tools.reliability.evidence import (
    EXCEPTION_LINE,
    IN_PROCESS_STATE,
    NETWORK_ERROR,
    NODE_DOWN,
    Evidence,
    reported_timeout,
)
from trainops.tools.reliability.next_steps import requeue_can_help
from trainops.tools.reliability.oom_advice import oom_next_step
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED
from trainops.tools.reliability.signature_match import (
    TRUST_SPECIFICITY,
    SignatureHit,
    missing_ranks,
    named_cause,
    signature,
)

Cause = Literal["hardware", "network", "software", "data", "planned", "hung-peer", "gpu-memory", "host-memory",
                "storage", "configuration", "injected", "unclassified"]
CAUSES: tuple[str, ...] = ("hardware", "network", "software", "data", "planned", "hung-peer", "gpu-memory",
                           "host-memory", "storage", "configuration", "injected", "unclassified")
Confidence = Literal["high", "medium", "low"]
COLLECT = ("collect: the failing rank's full log around its last step, the node's kernel log (OOM kills, Xid, "
           "ECC, NVLink), the scheduler's state and reason for the job and its nodes")
CHECK_THE_NODES = ("run trainops' known-answer check on the job's nodes as the scheduler names them (respond_to_sdc), "
                   "and read the nodes' kernel logs")


class Diagnosis(BaseModel):
    """The cause the evidence supports, how sure, the line that names it and what to do next."""
    cause: Cause
    reason: str
    sub_cause: str = ""
    confidence: Confidence = "low"
    quote: str = Field("", description="The line that names the problem, as logged.")
    next_step: str = COLLECT
    requeue_helps: bool | None = Field(None, description="Whether a plain requeue can help (None: not known).")
    alternatives: list[str] = Field(default_factory=list, description="Causes other specific lines point to.")
_LAUNCHER = re.compile(r"ChildFailedError|torch\.distributed\.elastic|torchrun|failed \(exitcode", re.I)


def lost_ranks(ev: Evidence) -> list[int]:
    """Ranks that ended without an exit note: seen gone just before the end, else silent while their
    peers noted theirs, else reported by the launcher killed by a signal (a negative exit code) and
    noting nothing (a rank that noted its launcher's SIGTERM was torn down, not lost)."""
    gone = [r for r, st in ev.ranks_at_end.items() if st == "gone" and r not in ev.noted_ranks]
    return gone or ev.silent_ranks or sorted(r for r, code in ev.rank_exit_codes.items()
                                             if code < 0 and r not in ev.noted_ranks and r not in ev.torn_down_ranks)


def stalled_rank(ev: Evidence, stale_s: float) -> int | None:
    """The rank whose process lived but stopped making progress: seen stopped, or whose heartbeat is
    the stalest and older than `stale_s` at the end."""
    stopped = [r for r, st in ev.ranks_at_end.items() if st == "stopped"]
    if stopped:
        return stopped[0]
    ages = ev.heartbeat_age_s
    if ages and max(ages.values()) > stale_s and all(st == "running" for st in ev.ranks_at_end.values()):
        return max(ages, key=ages.get)
    return None


def diagnose(ev: Evidence, planned: bool = False, stale_s: float = 5.0) -> Diagnosis:
    """The cause the evidence supports, with its confidence, quote and next step; "unclassified"
    says what was seen. The rules and their order are the module's docstring."""
    found = _diagnose(ev, planned, stale_s)
    if ev.corrupt_checkpoints:
        found.reason += (f"; on restart committed checkpoint(s) {ev.corrupt_checkpoints} failed verification "
                         "(changed after their commit) and the restart fell back to an older one")
    return found


def _witnessed(cause: Cause, reason: str, step: str, sub: str, requeue: bool | None = None) -> Diagnosis:
    """A verdict from what trainops or the scheduler witnessed (not a job's text); whether a requeue
    can help is the cause class's (next_steps.py) unless `requeue` says otherwise."""
    return Diagnosis(cause=cause, reason=reason, sub_cause=sub, confidence="high", next_step=step,
                     requeue_helps=requeue_can_help(cause, sub, witnessed=True) if requeue is None else requeue)


def _diagnose(ev: Evidence, planned: bool, stale_s: float) -> Diagnosis:  # noqa: PLR0911 - one return per rule
    if planned:  # a healthy job's cancel: an operator's, unless the scheduler's own state names another end
        return scheduler_ended(ev) or _witnessed("planned", f"ended by an operator ({ev.state}: "
                                                 f"{ev.reason or 'cancelled'})", "nothing to fix; requeue when wanted",
                                                 "cancelled")
    if ev.checksum_verdict == "disagree":  # the run's own metrics: a suspicion the known-answer checks settle
        return Diagnosis(cause="hardware", sub_cause="sdc", confidence="medium", requeue_helps=False,
                         reason=f"replica checksums disagree ({ev.checksum_detail}): suspected silent data corruption, "
                                "from the run's own metrics until trainops' known-answer checks on its nodes agree",
                         next_step="respond to the suspected SDC: known-answer checks fleet-wide and co-located")
    down = {n: s for n, s in ev.node_states.items() if NODE_DOWN.search(s)}
    node_fail = re.search(r"NODE_FAIL|node.*(down|fail|lost|not responding)", ev.reason, re.I)
    alive = sorted(r for r, st in ev.ranks_at_end.items() if st == "running" and ev.rank_nodes.get(r) in down)
    if alive:
        nodes = ", ".join(f"{n} {s}" for n, s in down.items() if n in {ev.rank_nodes[r] for r in alive})
        return _witnessed("network", f"the scheduler lost {nodes} while rank(s) {alive} there still ran: the node is "
                          "unreachable, not dead (a partition)", "requeue excluding the unreachable node", "partition")
    if (down or node_fail) and (ev.signal in ("SIGKILL", None) or node_fail):
        nodes = ", ".join(f"{n} {s}" for n, s in down.items()) or ev.reason
        said = f" (the scheduler's job state {ev.reason})" if node_fail and down else ""
        return _witnessed("hardware", f"processes ended ({ev.signal or ev.state}) with the node down: {nodes}{said}",
                          "drain the node and requeue on healthy nodes from the last good checkpoint",
                          "node-failure")
    if ev.oom_kills:
        return _witnessed("host-memory", f"the kernel's OOM killer ended a rank (the job's host memory use): "
                          f"{ev.oom_kills[-1]}", signature("oom-killer").next_step, "oom-kill")
    if ev.nonfinite_loss_step is not None and ev.nonfinite_repeats:
        return _witnessed("data", f"non-finite loss at data position step {ev.nonfinite_loss_step} recurs on replay"
                          + (f" ({ev.replay})" if ev.replay else ""), "skip or fix the data at that position",
                          "nan-recurs")
    if ev.nonfinite_loss_step is not None and ev.nonfinite_repeats is False:
        return _did_not_recur(ev)  # trainops' own replay outranks the job's 'loss nan' line
    if (ended := scheduler_ended(ev)) is not None:
        return ended
    trusted = [h for h in ev.signatures if h.specificity >= TRUST_SPECIFICITY]
    if (named := named_cause(trusted)) is not None:
        return _from_signature(ev, named, trusted)
    return _without_a_named_cause(ev, stale_s, trusted)


_SCHEDULER_ENDS = {"PREEMPTED": ("preemption", "the scheduler preempted the job", "slurm-preempted"),
                   "TIMEOUT": ("time-limit", "the job reached its time limit", "slurm-time-limit"),
                   "REQUEUED": ("requeue", "the scheduler requeued the job", "slurm-requeued")}
"""The scheduler's own job state (Slurm's, as its backend reports it: 'STATE: reason') that ends a
job for a planned reason: witnessed, unlike the same words in the job's output."""


def scheduler_ended(ev: Evidence) -> Diagnosis | None:
    """The planned end the scheduler's own job state names (Slurm's PREEMPTED, TIMEOUT, REQUEUED), or None."""
    state = ev.reason.split(":", 1)[0].strip()
    if state not in _SCHEDULER_ENDS:
        return None
    sub, what, sig = _SCHEDULER_ENDS[state]
    return _witnessed("planned", f"{what} (the scheduler's job state {ev.reason})", signature(sig).next_step, sub)


def _did_not_recur(ev: Evidence) -> Diagnosis:
    replay = ev.replay or "a later launch replayed it"
    return Diagnosis(cause="unclassified", reason=(
        f"non-finite loss at step {ev.nonfinite_loss_step} did not recur when {replay}; not the data at that "
        f"position; replica checksums {ev.checksum_verdict or 'not compared'}; nothing else says what caused it"))


def _without_a_named_cause(ev: Evidence, stale_s: float, trusted: list[SignatureHit]) -> Diagnosis:
    nodes = ", ".join(f"{n} ({s})" for n, s in ev.node_states.items()) or ev.failing_node or "unknown"
    kernel = ("no OOM kill in the kernel log" if ev.kernel_log_read else "the kernel log was not readable")
    lost = lost_ranks(ev)
    if lost:
        return Diagnosis(cause="unclassified", reason=_lost_reason(ev, lost, nodes, kernel))
    if (stalled := stalled_rank(ev, stale_s)) is not None and not _exceptions(ev):
        state = ev.ranks_at_end.get(stalled, "")
        peers = ("no error line of its own (its peers' bounded collectives then timed out)"
                 if ev.state == IN_PROCESS_STATE or trusted else "no error line and no collective timeout")
        return Diagnosis(cause="hung-peer", sub_cause="stalled-rank", confidence="high" if trusted else "medium",
                         reason=(f"rank {stalled} did not arrive: its heartbeat stalled "
                                 f"{ev.heartbeat_age_s.get(stalled, 0.0):.1f} s before the end while its process "
                                 f"lived{f' ({state})' if state else ''} on live node(s) {nodes}; {peers}; nothing "
                                 "says why it stalled"),
                         next_step=f"read rank {stalled}'s stack (py-spy dump, the flight recorder) and fix the code "
                                   "path it was in; a requeue meets the same stall",
                         requeue_helps=requeue_can_help("hung-peer", "stalled-rank", witnessed=True))
    if trusted:
        return _from_signature(ev, trusted[0], trusted)
    net = [ln for ln in ev.error_lines if NETWORK_ERROR.search(ln)]
    if frames := [h for h in ev.signatures if h.cause == "hung-peer"]:  # a timeout with no network evidence
        return _from_signature(ev, frames[0], frames, confidence="low")
    if net:
        return Diagnosis(cause="network", confidence="medium", quote=net[-1], sub_cause="connection",
                         reason=f"connection failure between live nodes ({nodes}): {net[-1]}",
                         next_step="find the rank that failed first, then check the link between the nodes",
                         requeue_helps=requeue_can_help("network", "connection", witnessed=False))
    hints = [h for h in ev.signatures if h.specificity == TRUST_SPECIFICITY - 1]
    if hints:
        return _from_signature(ev, hints[0], hints, confidence="low")
    raised = [h for h in ev.signatures if h.name == "exception"]
    if (exc := _exceptions(ev)) or raised:
        rank = ev.failing_rank if ev.failing_rank is not None else raised[0].rank if raised else None
        where = f"rank {rank} of {_job(ev)}" if rank is not None else _job(ev)
        line = raised[-1].line if raised else exc[-1]
        return Diagnosis(cause="software", sub_cause="exception", confidence="medium", quote=line,
                         reason=f"a Python exception in {where}: {exc[-1] if exc else line}",
                         next_step="read the exception and the code path it names; a requeue repeats it",
                         requeue_helps=requeue_can_help("software", "exception", witnessed=False))
    if claims := _known_answer_failures(ev):
        return Diagnosis(cause="unclassified", quote=claims[-1], reason=(
            f"the job's output carries the known-answer check's failure line ({claims[-1]}); any job can print "
            "it, and a host it names is the job's word: only trainops' own check job, read from its scheduler log, "
            "convicts a node"), next_step=CHECK_THE_NODES)
    generic = [h for h in ev.signatures if 0 < h.specificity < TRUST_SPECIFICITY - 1]
    seen = _seen(ev) + [f"a generic line ({signature(h.name).implies}), not enough alone: {h.line}"
                        for h in generic[:1]]
    return Diagnosis(cause="unclassified", reason="no rule matched the evidence: " + "; ".join(seen),
                     quote=generic[0].line if generic else "")


def _job(ev: Evidence) -> str:
    return ev.framework or "the job (its log names no framework)"


def _from_signature(ev: Evidence, top: SignatureHit, hits: list[SignatureHit],
                    confidence: Confidence | None = None) -> Diagnosis:
    """A verdict from the most specific declared signature: contradicting specific lines lower the
    confidence and are listed; a hardware suspicion from a job's text is labelled as such."""
    sig = signature(top.name)
    others = sorted({h.cause for h in hits if h.cause != top.cause and h.specificity >= TRUST_SPECIFICITY})
    where = f" (rank {top.rank})" if top.rank is not None else ""
    reason = f"{_job(ev)}{where}: {sig.implies}: {top.line}"
    if top.cause == "hung-peer":
        waiting = reported_timeout(ev)
        missing = missing_ranks(waiting, ev.world_size, ev.torn_down_ranks)
        stopped = "; the launcher stopped it while it still ran" if set(missing) <= set(ev.torn_down_ranks) else ""
        named = (f", rank {', '.join(map(str, missing))} did not (inferred from which ranks reported{stopped}): the "
                 "likely missing rank" if missing else "; the log does not say which rank did not arrive"
                 + ("" if ev.world_size else " (the job's world size is not known)"))
        reason = (f"{_job(ev)}: {sig.implies}; "
                  + (f"rank(s) {waiting} reported the timeout" if waiting else "no line names the rank that waited")
                  + named
                  + "".join(f"; rank {r} was in {ev.stopped_doing[r]} when its launcher stopped it"
                            for r in missing if r in ev.stopped_doing)
                  + f": {top.line}")
    if top.cause == "hardware":
        reason += "; from the job's own text only: a hypothesis until trainops' check on the node agrees"
    sure = confidence or ("high" if top.specificity >= TRUST_SPECIFICITY and not others and sig.settles
                          and top.cause != "hung-peer" and not sig.job_writable else "medium")
    requeue = requeue_can_help(top.cause, top.sub_cause, witnessed=False)  # a line of the job's own text
    if sig.job_writable:  # the scheduler's words in the job's own output: the job could have printed them
        reason += "; read from the job's output, not the scheduler's job state"
    later = failed_after(ev, top) if top.cause == "planned" else None
    if later is not None:
        reason += f"; the log goes on after that line and fails: {later.line}"
        requeue = False
    if others:
        reason += f"; other lines point to {', '.join(others)}"
    step = oom_next_step(top.line, ev.recipe, sig.next_step) if top.name == "cuda-oom" else sig.next_step
    if later is not None:
        step = ("the job (or a restart of it in the same log) failed after the scheduler's end line: read that "
                "failure and fix it first, a requeue meets it again; the scheduler's accounting (sacct -j JOB -o "
                "JobID,State,Reason) says which run ended how")
    return Diagnosis(cause=top.cause, sub_cause=top.sub_cause, confidence=sure, quote=top.line, reason=reason,
                     next_step=step, requeue_helps=requeue, alternatives=others)


_END_ECHOES = frozenset({"planned", "network", "unclassified"})
"""Causes of lines that echo a scheduler's end (the cancel lines, peers' sockets closing as the step is torn down)."""
_SIGNAL_REPORT = re.compile(r"signal|SIGTERM|SIGKILL|Terminated", re.I)


def failed_after(ev: Evidence, end: SignatureHit) -> SignatureHit | None:
    """The job's own failure printed after a scheduler's end line, or None: a planned end is the log's last word
    but for its teardown; a failure after it (a restart's, or the job's own while it went on) is what ended the
    run, and a requeue meets it again. A traceback that reports the signal the end sent is the end's own."""
    after = [h for h in ev.signatures if h.index > end.index and h.cause not in _END_ECHOES and h.name != "killed"]
    return None if not after or any(_SIGNAL_REPORT.search(h.line) for h in after) else after[0]


def _known_answer_failures(ev: Evidence) -> list[str]:
    return [ln for ln in ev.error_lines if KNOWN_ANSWER_FAILED in ln]


def _exceptions(ev: Evidence) -> list[str]:
    """Exception lines of a rank or the run; the launcher's report of a child's failure is not one."""
    return [ln for ln in ev.error_lines if not _LAUNCHER.search(ln) and "Traceback (most recent" not in ln
            and (EXCEPTION_LINE.search(ln.split(": ", 1)[-1]) or "Error" in ln)]


def _lost_reason(ev: Evidence, lost: list[int], nodes: str, kernel: str) -> str:
    codes = [f"rank {r} exit {ev.rank_exit_codes[r]}" for r in lost if r in ev.rank_exit_codes]
    how = f" (the launcher reports {', '.join(codes)})" if codes else " (a signal it could not trap, e.g. SIGKILL)"
    peers = sorted(set(ev.heartbeat_age_s) | set(ev.ranks_at_end)) or lost
    if set(peers) <= set(lost):
        who = f"every rank ({', '.join(map(str, lost))}) ended without an exit note{how} on node(s) {nodes}, up"
        return f"{who}; {kernel}; nothing says what killed them"
    alive = [r for r in peers if r not in lost]
    peer_errors = f"; the peers' errors follow from it ({ev.error_lines[-1][:120]})" if ev.error_lines else ""
    return (f"rank {', '.join(map(str, lost))} ended without an exit note{how} while its peers ran on live node(s) "
            f"{nodes}; {kernel}; nothing says what killed it (rank(s) {alive} lived){peer_errors}")


def _seen(ev: Evidence) -> list[str]:
    seen = [f"state {ev.state}", f"exit {ev.exit_code}" if ev.exit_code is not None else "no exit code"]
    if ev.signal:
        seen.append(f"signal {ev.signal}")
    if ev.nonfinite_loss_step is not None:
        seen.append(f"non-finite loss at step {ev.nonfinite_loss_step} (not replayed)")
    if ev.heartbeat_age_s:
        seen.append(f"stalest heartbeat {max(ev.heartbeat_age_s.values()):.1f} s")
    return seen
