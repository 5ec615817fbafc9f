"""What a node drill adds to a drill (S5): a per-node timeline, Slurm's own view of the lost node as
confirmation of what the job's signals showed first, the health check a repaired node passes
before it goes back to the pool, and which node replaced which. A drill asks its target (RankTarget
for a fault that hits a rank, NodeTarget for one that takes a node away) at each phase, so the
drill itself reads the same for both."""
from __future__ import annotations

import contextlib
import threading
import time

from trainops.run_records import read_heartbeats
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.context import CallContext
from trainops.tools.jobs import jobs
from trainops.tools.reliability import faults
from trainops.tools.reliability.reachability import SLOW_RTT_FLOOR_S, probe_nodes, slurm_node_states

SLURM_POLL_S = 0.5
SLURM_CONFIRM_WAIT_S = 30.0
"""How long a drill waits for Slurm to flag a crashed or partitioned node (SlurmdTimeout=10 flags it
after 7-12 s) before it repairs the node; a slow link answers Slurm's pings, so no wait there."""
CONFIRMED_BY_SLURM = ("not_responding", "down")


class NodeTimeline:
    """Every step a node drill takes, and every change of Slurm's state for the cluster's nodes
    (polled in the background every SLURM_POLL_S), as {time, node, event} in wall-clock order."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slurm-node-watch", daemon=True)

    def __enter__(self) -> NodeTimeline:
        self._poll()
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def add(self, node: str, event: str, at: float | None = None) -> None:
        self.events.append({"time": time.time() if at is None else at, "node": node, "event": event})

    def _poll(self) -> None:
        for node, state in slurm_node_states().items():
            if state != self._seen.get(node):
                self._seen[node] = state
                self.add(node, f"slurm: {state}")

    def _watch(self) -> None:
        while not self._stop.wait(SLURM_POLL_S):
            self._poll()

    def injected_node(self) -> str | None:
        """The node the drill injected its fault into, once it has."""
        return next((e["node"] for e in self.events if e["event"].startswith("injected")), None)

    def slurm_flagged(self, node: str, since: float) -> float | None:
        """When Slurm first called `node` not responding or down after `since`, if it has."""
        return next((e["time"] for e in self.events if e["node"] == node and e["time"] >= since
                     and e["event"].startswith("slurm:") and any(w in e["event"] for w in CONFIRMED_BY_SLURM)), None)

    def wait_for_slurm(self, node: str, since: float, timeout_s: float = SLURM_CONFIRM_WAIT_S) -> float | None:
        """Wait until Slurm flags `node`, at most until `timeout_s` after `since` (the fault)."""
        deadline = since + timeout_s
        while (flagged := self.slurm_flagged(node, since)) is None and time.time() < deadline:
            time.sleep(SLURM_POLL_S / 2)
        return flagged

    def rows(self, since: float) -> list[dict]:
        """The timeline relative to `since` (the injection), for the drill record: each node's Slurm
        state as the fault struck, then everything after."""
        ordered = sorted(self.events, key=lambda e: e["time"])
        before = {e["node"]: e for e in ordered if e["time"] < since and e["event"].startswith("slurm:")}
        kept = [*sorted(before.values(), key=lambda e: e["time"]), *(e for e in ordered if e["time"] >= since)]
        return [{"t_s": round(e["time"] - since, 3), "node": e["node"], "event": e["event"]} for e in kept]


def health_check(node: str, timeout_s: float = 30.0) -> str:
    """A repaired node may go back only when it answers on the network as fast as a healthy link
    does and Slurm no longer calls it not responding or down. Returns what was seen."""
    deadline = time.time() + timeout_s
    rtt, state = None, ""
    while time.time() < deadline:
        rtt, state = probe_nodes([node]).get(node), slurm_node_states().get(node, "")
        if (rtt is not None and rtt < SLOW_RTT_FLOOR_S
                and not any(w in state for w in CONFIRMED_BY_SLURM)):
            return f"{node} answers in {rtt * 1000:.1f} ms; Slurm: {state}"
        time.sleep(0.25)
    seen = "no answer" if rtt is None else f"{rtt * 1000:.0f} ms"
    raise ToolError("drill", f"health check: {node} is not healthy after {timeout_s:.0f} s of repair ({seen}, Slurm "
                             f"state {state or 'unknown'}); it stays drained: look at its link and slurmd log")


def replacement(lost: str, before: list[str], after: list[str]) -> str:
    """Which node took the lost node's place, in words."""
    spares = [n for n in after if n not in before]
    if lost in after or not spares:
        return f"{lost} was not replaced (the restart ran on {', '.join(after)})"
    return f"{lost} replaced by {', '.join(spares)}"


class RankTarget:
    """A drill whose fault hits one rank: no node is lost, so there is nothing to track or repair."""

    def __enter__(self) -> RankTarget:
        return self

    def __exit__(self, *_exc) -> None:
        pass

    def choose(self, job_id: str, rank: int, scheduler: str, ctx: CallContext, run_dir: str = "") -> dict:
        """The inject_fault target."""
        return {"rank": rank}

    def injected(self, kind: str, at: float) -> None:
        """The fault went in at `at`."""

    def note(self, node: str, event: str, at: float | None = None) -> None:
        """A step of the drill that concerns a node."""

    def restarted(self, job_id: str, first_step_at: float, scheduler: str, ctx: CallContext) -> str:
        """Where the restarted job runs, for the detector line."""
        return ""

    def admitted(self, recovered) -> str:
        """Where an in-process recovery's spares took the lost ranks, for the detector line."""
        return ""

    def repair(self, injected_at: float, ctx: CallContext) -> str:
        """Undo the fault once the restarted job is done, and say what confirmed it."""
        return ""

    def undo(self, ctx: CallContext) -> None:
        """After a failed drill: undo our own fault."""

    def record(self, injected_at: float) -> dict:
        """What the drill record adds."""
        return {}

    def node_states(self, injected_at: float) -> dict[str, str]:
        """The scheduler's verdict on the job's nodes after the fault, for the record of its end."""
        return {}

    def evidence(self, record_path: str) -> str:
        """What the evidence row's value adds."""
        return ""


class NodeTarget(RankTarget):
    """A node drill: the fault takes the job's last node (it holds the highest ranks, never the
    rendezvous host); every step goes on a per-node timeline beside Slurm's view, and the node is
    healed and checked once the restarted job is done."""

    def __init__(self, fault: str) -> None:
        self.timeline = NodeTimeline()
        self.expect_slurm_flag = fault != "slow-network"  # a slow link still answers Slurm's pings
        self.node, self.before, self.replaced = "", [], ""

    def __enter__(self) -> NodeTarget:
        self.timeline.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.timeline.__exit__(*exc)

    def choose(self, job_id: str, rank: int, scheduler: str, ctx: CallContext, run_dir: str = "") -> dict:
        """The node of the job's highest rank, as its heartbeat names it (a job with spare nodes
        holds them last, and they hold no rank), else the job's last node."""
        self.before = invoke(jobs.job_status, jobs.JobRef(job_id=job_id, scheduler=scheduler), ctx).nodes
        beats = {r: b.host for r, b in (read_heartbeats(run_dir) if run_dir else {}).items() if b.host in self.before}
        self.node = beats[max(beats)] if beats else self.before[-1]
        return {"node": self.node}

    def injected(self, kind: str, at: float) -> None:
        self.timeline.add(self.node, f"injected {kind}", at)

    def note(self, node: str, event: str, at: float | None = None) -> None:
        self.timeline.add(node, event, at)

    def restarted(self, job_id: str, first_step_at: float, scheduler: str, ctx: CallContext) -> str:
        after = invoke(jobs.job_status, jobs.JobRef(job_id=job_id, scheduler=scheduler), ctx).nodes
        for node in after:
            self.timeline.add(node, f"first step of the restarted job {job_id}", first_step_at)
        self.replaced = replacement(self.node, self.before, after)
        return (f"; node {self.node} lost (ran on {', '.join(self.before)}), restarted on {', '.join(after)}: "
                f"{self.replaced}")

    def admitted(self, recovered) -> str:
        """The lost node's ranks went to warm spares the job already held (its spare node): the job
        kept running, so nothing was requeued onto the pool."""
        hosts = sorted(set(recovered.admitted_on.values()))
        if not hosts:
            return ""
        for host in hosts:
            self.timeline.add(host, f"warm spares took rank(s) {sorted(recovered.admitted_on)} in process",
                              recovered.first_step_at)
        self.replaced = (f"{self.node} replaced by {', '.join(hosts)} in process (the job's warm spares took rank(s) "
                         f"{sorted(recovered.admitted_on)})")
        return f"; {self.replaced}"

    def repair(self, injected_at: float, ctx: CallContext) -> str:
        """Slurm's view confirms, then the repair and a health check before the node goes back."""
        confirmation = self._slurm_confirmation(injected_at)
        invoke(faults.inject_fault, faults.InjectFaultInput(kind="heal_node", node=self.node), ctx)
        self.timeline.add(self.node, "healed (link up, no rate limit, slurmd running)")
        self.timeline.add(self.node, f"health check: {health_check(self.node)}")
        return "; " + confirmation

    def _slurm_confirmation(self, injected_at: float) -> str:
        """Slurm's own verdict on the lost node: a crashed or partitioned node is waited for
        (SlurmdTimeout), a slow link is not, since it still answers Slurm's pings."""
        node = self.node
        flagged = (self.timeline.wait_for_slurm(node, injected_at) if self.expect_slurm_flag
                   else self.timeline.slurm_flagged(node, injected_at))
        if flagged is None and self.expect_slurm_flag:
            return f"Slurm did not flag {node} within {SLURM_CONFIRM_WAIT_S:.0f} s of the fault"
        if flagged is None:
            return f"Slurm never flagged {node} (a slow link still answers its pings)"
        return f"Slurm confirmed {node} not responding {flagged - injected_at:.1f} s after the fault"

    def undo(self, ctx: CallContext) -> None:
        """Heal the node we injected into, if we did; a node we drained stays drained."""
        if lost := self.timeline.injected_node():
            with contextlib.suppress(ToolError):
                with validating(faults.inject_fault):
                    heal = faults.InjectFaultInput(kind="heal_node", node=lost)
                invoke(faults.inject_fault, heal, ctx)

    def node_states(self, injected_at: float) -> dict[str, str]:
        """Each of the job's nodes Slurm flagged not responding or down after the fault (the record
        of the job's end was taken at the cancel, often before SlurmdTimeout flagged the node)."""
        flagged = {}
        for e in sorted(self.timeline.events, key=lambda e: e["time"]):
            state = e["event"].removeprefix("slurm: ")
            if (e["node"] in self.before and e["time"] >= injected_at and e["event"].startswith("slurm:")
                    and any(w in state for w in CONFIRMED_BY_SLURM)):
                flagged.setdefault(e["node"], state)
        return flagged

    def record(self, injected_at: float) -> dict:
        return {"replaced": self.replaced, "node_timeline": self.timeline.rows(injected_at)}

    def evidence(self, record_path: str) -> str:
        return f"; {self.replaced}; per-node timeline in {record_path}"
