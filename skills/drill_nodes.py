"""What a node drill adds to a drill (S5): a per-node timeline, Slurm's own view of the lost node as
confirmation of what the job's signals showed first, the health check a repaired node passes
before it goes back to the pool, and which node replaced which."""
from __future__ import annotations

import threading
import time

from trainops.tools.base import ToolError
from trainops.tools.reachability import SLOW_RTT_FLOOR_S, probe_nodes, slurm_node_states

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
