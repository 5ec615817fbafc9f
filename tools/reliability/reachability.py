"""Network probes of a job's nodes, as seen from where trainops runs: a TCP connect to each node's
slurmd. A partitioned node does not answer at all; a node behind a slow link answers late (its
queue holds the connect behind the job's own traffic), so one round of probes names the node a
stalled or slowed job is waiting on. The node's address and port come from Slurm itself, so a
name the job reports (a heartbeat's `host`) is all a probe needs."""
from __future__ import annotations

import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from trainops.tools.schedulers.base import SchedulerError
from trainops.tools.schedulers.slurm_transport import parse_scontrol, run_cli

PROBE_TIMEOUT_S = 0.5
SLOW_RTT_FLOOR_S = 0.02  # a healthy link on one fabric answers a connect in well under a millisecond
SLOW_RTT_RATIO = 10.0
_addresses: dict[tuple[str, str], tuple[str, int] | None] = {}


def slurmd_endpoint(node: str) -> tuple[str, int] | None:
    """(NodeAddr, SlurmdPort) of a Slurm node, or None when Slurm does not know it. Cached per
    SLURM_CONF: neither changes while a cluster runs."""
    key = (os.environ.get("SLURM_CONF", ""), node)
    if key not in _addresses:
        try:
            shown = parse_scontrol(run_cli(["scontrol", "-o", "show", "node", node]).stdout)
            port = re.search(r"^SlurmdPort\s*=\s*(\d+)", run_cli(["scontrol", "show", "config"]).stdout, re.M)
        except (SchedulerError, ValueError):
            shown = {}
        _addresses[key] = (shown["NodeAddr"], int(port.group(1)) if port else 6818) if shown.get("NodeAddr") else None
    return _addresses[key]


def connect_rtt_s(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> float | None:
    """Seconds for a TCP connect to answer (accepted or refused: either way the node is there);
    None when nothing answers within `timeout_s` or the host is unreachable."""
    started = time.perf_counter()
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            pass
    except ConnectionRefusedError:
        pass
    except OSError:
        return None
    return time.perf_counter() - started


def probe_nodes(nodes: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, float | None]:
    """Node -> connect round trip in seconds (None: no answer), all nodes probed at once, so a
    round takes at most `timeout_s`. Nodes Slurm does not know are left out."""
    endpoints = {n: e for n in nodes if (e := slurmd_endpoint(n)) is not None}
    if not endpoints:
        return {}
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        rtts = pool.map(lambda e: connect_rtt_s(*e, timeout_s=timeout_s), endpoints.values())
        return dict(zip(endpoints, rtts, strict=True))


def slow_outlier(rtts: dict[str, float | None]) -> tuple[str, str] | None:
    """The one reachable node whose round trip is far above every other's: (node, why)."""
    answered = {n: r for n, r in rtts.items() if r is not None}
    if len(answered) < 2:
        return None
    slowest = max(answered, key=answered.get)
    others = max(r for n, r in answered.items() if n != slowest)
    if answered[slowest] > SLOW_RTT_FLOOR_S and answered[slowest] > SLOW_RTT_RATIO * max(others, 1e-4):
        return slowest, (f"node {slowest} answers a connect in {answered[slowest] * 1000:.0f} ms against at most "
                         f"{others * 1000:.1f} ms for {', '.join(sorted(n for n in answered if n != slowest))}")
    return None


def slurm_node_states() -> dict[str, str]:
    """Node -> Slurm's own view of it, e.g. `mixed+not_responding`, `down+drain` (one `scontrol`
    call; `sinfo` can lag it); empty when Slurm does not answer."""
    try:
        shown = run_cli(["scontrol", "-o", "show", "node"]).stdout.splitlines()
    except SchedulerError:
        return {}
    fields = [parse_scontrol(line) for line in shown]
    return {f["NodeName"]: f.get("State", "").lower() for f in fields if "NodeName" in f}
