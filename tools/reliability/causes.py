"""The cause a job end's evidence supports (tools/reliability/evidence.py gathers it), by rules over
that evidence alone. A drill's name and the faults.jsonl kind are never read: a drill's injected
fault acts like the real one, and its record says what the evidence says, or "unclassified" with
the evidence.

The rules, first match wins (classify):
- an operator's cancel of a healthy job -> planned;
- replica checksums disagree at one step -> hardware (suspected silent data corruption);
- a known-answer GEMM/collective check (tools/reliability/sdc_check.py) computed wrong results -> hardware;
- a node the scheduler calls down / not responding whose ranks were still running -> network
  (unreachable, not dead: a partition);
- processes ended (SIGKILL, or no word) with their node down / not responding -> hardware;
- the kernel's OOM killer ended a rank -> software (the job's memory use outgrew the node);
- a NaN/inf loss at a step that recurs when a later launch replays that step -> data;
- a rank gone without an exit note while its peers ran on a live node -> its peers' connection
  errors are consequences; nothing says what killed it -> unclassified, stating what was seen;
- connection resets / collective timeouts between live nodes -> network;
- a rank's heartbeat stalled while its process lived on a live node, no error -> unclassified
  stating the stall;
- a NaN/inf that did not recur on replay -> not the data there: unclassified, stating it;
- a Python exception in a rank or the run's failure line (not the launcher's report of a
  child's failure) -> software;
- otherwise unclassified with what was seen."""
from __future__ import annotations

import re
from typing import Literal

from trainops.tools.reliability.evidence import (
    EXCEPTION_LINE,
    IN_PROCESS_STATE,
    NETWORK_ERROR,
    NODE_DOWN,
    Evidence,
)
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED

Cause = Literal["hardware", "network", "software", "data", "planned", "unclassified"]
CAUSES: tuple[str, ...] = ("hardware", "network", "software", "data", "planned", "unclassified")
_LAUNCHER = re.compile(r"ChildFailedError|torch\.distributed\.elastic|torchrun|failed \(exitcode", re.I)


def lost_ranks(ev: Evidence) -> list[int]:
    """Ranks that ended without an exit note: seen gone just before the end, else silent while their
    peers noted theirs, else reported by the launcher killed by a signal (a negative exit code)."""
    gone = [r for r, st in ev.ranks_at_end.items() if st == "gone" and r not in ev.noted_ranks]
    return gone or ev.silent_ranks or sorted(r for r, code in ev.rank_exit_codes.items() if code < 0)


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


def classify(ev: Evidence, planned: bool = False, stale_s: float = 5.0) -> tuple[Cause, str]:
    """The cause the evidence supports and the evidence it used; "unclassified" says what was seen.
    The rules and their order are the module's docstring."""
    cause, reason = _classify(ev, planned, stale_s)
    if ev.corrupt_checkpoints:
        reason += (f"; on restart committed checkpoint(s) {ev.corrupt_checkpoints} failed verification (changed "
                   "after their commit) and the restart fell back to an older one")
    return cause, reason


def _classify(ev: Evidence, planned: bool, stale_s: float) -> tuple[Cause, str]:
    if planned:
        return "planned", f"ended by an operator ({ev.state}: {ev.reason or 'cancelled'})"
    if ev.checksum_verdict == "disagree":
        return "hardware", f"replica checksums disagree ({ev.checksum_detail}): suspected silent data corruption"
    if wrong := _known_answer_failures(ev):
        return "hardware", f"a known-answer GEMM/collective check computed wrong results: {wrong[-1]}"
    down = {n: s for n, s in ev.node_states.items() if NODE_DOWN.search(s)}
    node_fail = re.search(r"NODE_FAIL|node.*(down|fail|lost|not responding)", ev.reason, re.I)
    alive = sorted(r for r, st in ev.ranks_at_end.items() if st == "running" and ev.rank_nodes.get(r) in down)
    if alive:
        nodes = ", ".join(f"{n} {s}" for n, s in down.items() if n in {ev.rank_nodes[r] for r in alive})
        return "network", (f"the scheduler lost {nodes} while rank(s) {alive} there still ran: the node is "
                           "unreachable, not dead (a partition)")
    if (down or node_fail) and (ev.signal in ("SIGKILL", None) or node_fail):
        nodes = ", ".join(f"{n} {s}" for n, s in down.items()) or ev.reason
        return "hardware", f"processes ended ({ev.signal or ev.state}) with the node down: {nodes}"
    if ev.oom_kills:
        return "software", f"the kernel's OOM killer ended a rank (the job's memory use): {ev.oom_kills[-1]}"
    if ev.nonfinite_loss_step is not None and ev.nonfinite_repeats:
        return "data", (f"non-finite loss at data position step {ev.nonfinite_loss_step} recurs on replay"
                        + (f" ({ev.replay})" if ev.replay else ""))
    nodes = ", ".join(f"{n} ({s})" for n, s in ev.node_states.items()) or ev.failing_node or "unknown"
    kernel = ("no OOM kill in the kernel log" if ev.kernel_log_read else "the kernel log was not readable")
    lost = lost_ranks(ev)
    if lost:
        return "unclassified", _lost_reason(ev, lost, nodes, kernel)
    net = [ln for ln in ev.error_lines if NETWORK_ERROR.search(ln)]
    if net:
        return "network", f"connection failure between live nodes ({nodes}): {net[-1]}"
    if (stalled := stalled_rank(ev, stale_s)) is not None and not _exceptions(ev):
        state = ev.ranks_at_end.get(stalled, "")
        peers = ("no error line of its own (its peers' bounded collectives then timed out)"
                 if ev.state == IN_PROCESS_STATE else "no error line and no collective timeout")
        return "unclassified", (f"rank {stalled}'s heartbeat stalled {ev.heartbeat_age_s.get(stalled, 0.0):.1f} s "
                                f"before the end while its process lived{f' ({state})' if state else ''} on live "
                                f"node(s) {nodes}; {peers}; nothing says why it stalled")
    if ev.nonfinite_loss_step is not None and ev.nonfinite_repeats is False:
        replay = ev.replay or "a later launch replayed it"
        return "unclassified", (f"non-finite loss at step {ev.nonfinite_loss_step} did not recur when {replay}; "
                                "not the data at that position; replica checksums "
                                f"{ev.checksum_verdict or 'not compared'}; nothing else says what caused it")
    if exc := _exceptions(ev):
        where = f"rank {ev.failing_rank}" if ev.failing_rank is not None else "the trainer"
        return "software", f"a Python exception in {where}: {exc[-1]}"
    return "unclassified", "no rule matched the evidence: " + "; ".join(_seen(ev))


def _known_answer_failures(ev: Evidence) -> list[str]:
    return [ln for ln in ev.error_lines if KNOWN_ANSWER_FAILED in ln]


def _exceptions(ev: Evidence) -> list[str]:
    """Exception lines of a rank or the run; the launcher's report of a child's failure is not one."""
    return [ln for ln in ev.error_lines if not _LAUNCHER.search(ln)
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
