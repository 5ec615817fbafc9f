"""Node faults on a running `trainops sandbox`: crash and power loss, a partition, a slow link, and
healing them, all on the namespaces `sandbox.up` made and recorded, never on anything else.

These are what `inject_fault` acts on for the multi-node drills (tools/reliability/faults.py); the cluster's
lifecycle (up, down, status) is in `sandbox`.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from trainops.tools.sandbox.cluster import (
    DEFAULT_PREFIX,
    NODE_IF,
    SandboxError,
    SandboxState,
    in_namespace,
    load_state,
    namespace_pids,
    run_or_raise,
    signal_pids,
    start_slurmd,
    wait_until,
)


def heal_node(node: int, prefix: str = DEFAULT_PREFIX) -> None:
    """Undo a node fault: no rate limit, link up, and slurmd started again if it was killed. After a
    partition slurmd is restarted too, so it registers at once: Slurm pings a node it has set DOWN
    only now and then (measured: back 32 s after the link came up, against 1-2 s re-registering)."""
    state = _require_state(prefix)
    _check_node(state, node)
    slow_link(node, None, prefix)
    partitioned = "state DOWN" in run_or_raise(["ip", "link", "show", state.spec.host_link(node)]).stdout
    set_link(node, True, prefix)
    pid_file = Path(state.folder) / "state" / f"slurmd-n{node}.pid"
    try:
        pid = int(pid_file.read_text().strip())
        if "slurmd" not in Path(f"/proc/{pid}/cmdline").read_text():  # a reused pid is not ours to signal
            raise ProcessLookupError(pid)
        os.kill(pid, signal.SIGTERM if partitioned else 0)
        if partitioned:
            wait_until(10, f"node n{node}'s slurmd to stop", lambda: not _alive([pid]))
            start_slurmd(state, node)
    except (OSError, ValueError):
        start_slurmd(state, node)


def _require_state(prefix: str) -> SandboxState:
    state = load_state(prefix)
    if state is None:
        raise SandboxError(f"no sandbox {prefix!r} is up; run `trainops sandbox up --nodes N` first")
    return state


def _check_node(state: SandboxState, node: int) -> None:
    if not 1 <= node <= state.spec.nodes:
        raise SandboxError(f"node {node} is not in the sandbox: use 1..{state.spec.nodes}")


def crash_node(node: int, power_loss: bool = False, prefix: str = DEFAULT_PREFIX) -> list[int]:
    """SIGKILL slurmd and every process on node nK; with power_loss its link goes down first, so its
    peers see silence instead of connection resets. Returns the pids killed."""
    state = _require_state(prefix)
    _check_node(state, node)
    if power_loss:
        run_or_raise(["ip", "link", "set", state.spec.host_link(node), "down"])
    pids = namespace_pids(state.spec.ns(node))
    signal_pids(pids, signal.SIGKILL)
    wait_until(5, f"node n{node}'s processes to die", lambda: not _alive(pids))
    return pids


def _alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (a zombie waiting for its parent counts as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def set_link(node: int, up_: bool, prefix: str = DEFAULT_PREFIX) -> None:
    """Partition node nK (host-side link down; slurmd and its tasks keep running), or heal it."""
    state = _require_state(prefix)
    _check_node(state, node)
    run_or_raise(["ip", "link", "set", state.spec.host_link(node), "up" if up_ else "down"])


def slow_link(node: int, rate_mbit: float | None, prefix: str = DEFAULT_PREFIX) -> None:
    """Rate-limit both directions of node nK's link with tbf (netem is not in every kernel); None clears it."""
    state = _require_state(prefix)
    _check_node(state, node)
    host, inside = state.spec.host_link(node), state.spec.ns(node)
    if rate_mbit is None:
        subprocess.run(["tc", "qdisc", "del", "dev", host, "root"], capture_output=True, timeout=15)
        subprocess.run(in_namespace(inside, ["tc", "qdisc", "del", "dev", NODE_IF, "root"]), capture_output=True,
                       timeout=15)
        return
    if not 0.01 <= rate_mbit <= 100_000:
        raise SandboxError(f"rate_mbit={rate_mbit} is out of range: use 0.01..100000")
    qdisc = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "32kbit", "latency", "400ms"]
    run_or_raise(["tc", "qdisc", "replace", "dev", host, *qdisc])
    run_or_raise(in_namespace(inside, ["tc", "qdisc", "replace", "dev", NODE_IF, *qdisc]))
