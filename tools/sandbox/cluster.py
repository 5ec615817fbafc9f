"""A real multi-node Slurm cluster on this host, one network namespace per node (`trainops sandbox`).

Like `kind` for Kubernetes: for trying the multi-node SOP without a cluster, and for the tests.
Layout: a bridge in the root namespace at NET.1/24 (sbatch, squeue and trainops run there);
slurmctld in a namespace of its own at NET.2 (its ports cannot clash with another Slurm on the
host); node nK = namespace with a veth `tos0` at NET.(10+K), peer on the bridge, its own UTS and
mount namespace (hostname nK, an /etc/hosts listing the nodes) and `slurmd -N nK`. No default
route anywhere, so traffic stays inside the bridge's /24.

Everything `up` creates is recorded in `/run/trainops/sandbox-PREFIX/state.json` (namespaces,
links, the munged it started), and `down` removes exactly that, by name and pid, and nothing
else. The record is per host, not per workspace, like the namespaces it describes: `up` from any
workspace finds a running sandbox, and a reboot clears both. The node faults the drills inject
(crash, power loss, partition, slow link) and their healing are in `sandbox_faults`.
Slurm accounting (MariaDB + slurmdbd, limits and QOS enforced) is in `sandbox_accounting`.
Requires root and Linux (iproute2, util-linux, Debian's slurm-wlm, munge, mariadb-server, slurmdbd).
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
from pydantic import BaseModel, Field, field_validator

from trainops.tools.sandbox import accounting
from trainops.tools.sandbox.metrics import prometheus_url, start_prometheus, stop_prometheus

NODE_IF = "tos0"
SHADOW_PARTITION = "shadow"
SLURMCTLD, SLURMD, MUNGED = "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"


class SandboxError(RuntimeError):
    """The sandbox cannot be brought up or used: says what failed and what to do."""
class SandboxSpec(BaseModel):
    nodes: int = Field(3, ge=1, le=64, description="number of namespace nodes, n1..nN")
    prefix: str = Field("tos", description="names of namespaces and links start with it (1-6 letters/digits)")
    net: str = Field("10.251.7", description="first three octets of a private /24 nothing on this host uses")
    cpus_per_node: int = Field(2, ge=1, le=256, description="CPUs each node declares (may exceed the host)")
    memory_mib: int = Field(4000, ge=256, description="RealMemory each node declares")
    ctld_port: int = Field(17817, ge=1024, le=65535)
    slurmd_port: int = Field(17818, ge=1024, le=65535)
    dbd_port: int = Field(17819, ge=1024, le=65535, description="slurmdbd's port on the host (all addresses)")
    mariadb_port: int = Field(17820, ge=1024, le=65535, description="the accounting MariaDB's port on 127.0.0.1")
    slurmd_timeout_s: int = Field(10, ge=3, le=300,
                                  description="SlurmdTimeout: how soon Slurm calls a silent node down")
    prometheus_port: int = Field(0, ge=0, le=65535,
                                 description="start a Prometheus on 127.0.0.1:PORT scraping every node's trainer "
                                             "exporters (jobs set metrics.prometheus_port_base=17900); 0: none")
    shadow_nodes: int = Field(2, ge=0, le=8,
                              description="extra nodes n(N+1).. forming the 'shadow' partition where scheduler "
                                          "policy changes are replayed first (change_scheduler_policy; two, so its "
                                          "regression set holds a two-node job); 0: none")

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", value):
            raise ValueError(f"prefix {value!r}: use 1-6 lower-case letters or digits, starting with a letter")
        return value

    @field_validator("net")
    @classmethod
    def _net(cls, value: str) -> str:
        try:
            network = ipaddress.ip_network(f"{value}.0/24")
        except ValueError:
            raise ValueError(f"net {value!r}: give three octets such as 10.251.7") from None
        if not network.is_private:
            raise ValueError(f"net {value}.0/24 is not a private range; use one such as 10.251.7")
        return value

    @property
    def all_nodes(self) -> range:
        """Every node's number: the `nodes` of the sandbox partition, then the shadow partition's."""
        return range(1, self.nodes + self.shadow_nodes + 1)

    def ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    @property
    def ctl_ns(self) -> str:
        return f"{self.prefix}-ctl"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    def host_link(self, node: int | str) -> str:
        return f"{self.prefix}h{node}"

    def address(self, node: int) -> str:
        return f"{self.net}.{10 + node}"


class SandboxState(BaseModel):
    spec: SandboxSpec
    folder: str
    namespaces: list[str] = []
    links: list[str] = []
    munged_pid: int | None = Field(None, description="the munged this sandbox started (None: it reused one)")
    prometheus_pid: int | None = Field(None, description="the Prometheus this sandbox started, if asked for")
    mariadb_pid: int | None = Field(None, description="the MariaDB holding this sandbox's Slurm accounting")
    slurmdbd_pid: int | None = Field(None, description="the slurmdbd this sandbox started")
    bring_up_s: float | None = None

    @property
    def conf(self) -> Path:
        return Path(self.folder) / "slurm.conf"


DEFAULT_PREFIX = "tos"


def sandbox_dir(prefix: str = DEFAULT_PREFIX) -> Path:
    return Path(os.environ.get("TRAINOPS_SANDBOX_ROOT", "/run/trainops")) / f"sandbox-{prefix}"


def _state_path(prefix: str) -> Path:
    return sandbox_dir(prefix) / "state.json"


def load_state(prefix: str = DEFAULT_PREFIX) -> SandboxState | None:
    path = _state_path(prefix)
    if not path.is_file():
        return None
    try:
        return SandboxState.model_validate_json(path.read_text())
    except ValueError as exc:
        raise SandboxError(f"{path} is corrupt ({exc.__class__.__name__}); remove what it made by hand "
                           "(`ip netns list`) and delete the file") from None


def _save(state: SandboxState) -> None:
    path = _state_path(state.spec.prefix)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(path)


def run_or_raise(args: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run a host command; with `check`, a SandboxError quoting the command and its stderr if it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)
    if check and done.returncode != 0:
        raise SandboxError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return done


def in_namespace(ns: str, args: list[str]) -> list[str]:
    """argv run inside network namespace `ns`."""
    # nsenter, not `ip netns exec`: that remounts /sys, hides the cgroup tree, and slurmd dies.
    return ["nsenter", f"--net=/run/netns/{ns}", *args]


def _require_host() -> None:
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        raise SandboxError("the sandbox needs Linux network namespaces")
    if os.geteuid() != 0:
        raise SandboxError("the sandbox creates network namespaces: run `trainops sandbox` as root")
    missing = [tool for tool in ("ip", "nsenter", "unshare", "tc", "sinfo", "scontrol", "munge")
               if not shutil.which(tool)] + [d for d in (SLURMCTLD, SLURMD, MUNGED) if not Path(d).exists()]
    if missing:
        raise SandboxError(f"missing on this host: {', '.join(missing)}; install Debian's iproute2, util-linux, "
                           "slurm-wlm and munge")


def slurm_env(state: SandboxState) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(state.conf)}


def _munge_ok() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        return cred.returncode == 0 and subprocess.run(["unmunge"], input=cred.stdout, capture_output=True,
                                                       timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _start_munge() -> int | None:
    """Reuse a running munged (its socket serves every namespace); else start one and return its pid."""
    if _munge_ok():
        return None
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    run_or_raise([MUNGED, "--force"])
    wait_until(10, "munged to answer", _munge_ok)
    return int(Path("/run/munge/munged.pid").read_text().strip())


def wait_until(timeout_s: float, what: str, ready) -> None:
    """Poll `ready` every 0.1 s; a SandboxError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SandboxError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def _conf_text(spec: SandboxSpec, folder: Path) -> str:
    state, logs = folder / "state", folder / "log"
    lines = [
        f"ClusterName={spec.prefix}sandbox", f"SlurmctldHost={socket.gethostname().split('.')[0]}({spec.net}.2)",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        # cred_expire is also how long a requeued job waits before it may start again (default 120 s)
        "AuthInfo=cred_expire=10", "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=2", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides", "ReturnToService=2", "JobRequeue=1",
        "MinJobAge=3600", f"SlurmctldPort={spec.ctld_port}", f"SlurmdPort={spec.slurmd_port}",
        f"SlurmdTimeout={spec.slurmd_timeout_s}", "SlurmctldTimeout=10", "MessageTimeout=5", "TCPTimeout=2",
        "KillWait=5", "InactiveLimit=0", f"StateSaveLocation={state}/ctld", f"SlurmdSpoolDir={state}/d-%n",
        f"SlurmctldPidFile={state}/slurmctld.pid", f"SlurmdPidFile={state}/slurmd-%n.pid",
        f"SlurmctldLogFile={logs}/slurmctld.log", f"SlurmdLogFile={logs}/slurmd-%n.log",
        "SlurmctldDebug=info", "SlurmdDebug=info", *accounting.conf_lines(spec),
    ]
    for k in spec.all_nodes:
        lines.append(f"NodeName=n{k} NodeAddr={spec.address(k)} CPUs={spec.cpus_per_node} Sockets=1 "
                     f"CoresPerSocket={spec.cpus_per_node} ThreadsPerCore=1 RealMemory={spec.memory_mib} State=UNKNOWN")
    lines.append(f"PartitionName=sandbox Nodes=n[1-{spec.nodes}] Default=YES MaxTime=INFINITE State=UP")
    if spec.shadow_nodes:
        lines.append(f"PartitionName={SHADOW_PARTITION} Nodes=n[{spec.nodes + 1}-{spec.nodes + spec.shadow_nodes}] "
                     "Default=NO MaxTime=INFINITE State=UP")
    return "# written by trainops sandbox up\n" + "\n".join(lines) + "\n"


def _hosts_text(spec: SandboxSpec) -> str:
    rows = ["127.0.0.1 localhost", f"{spec.net}.1 {spec.prefix}host",
            f"{spec.net}.2 {spec.prefix}ctl {socket.gethostname().split('.')[0]}"]
    rows += [f"{spec.address(k)} n{k}" for k in spec.all_nodes]
    return "\n".join(rows) + "\n"


def _net_in_use(spec: SandboxSpec) -> bool:
    shown = run_or_raise(["ip", "-4", "-o", "addr", "show"]).stdout
    return f" {spec.net}." in shown


def _add_namespace(state: SandboxState, ns: str, link: str, address: str) -> None:
    run_or_raise(["ip", "netns", "add", ns])
    state.namespaces.append(ns)
    run_or_raise(["ip", "link", "add", link, "type", "veth", "peer", "name", NODE_IF, "netns", ns])
    state.links.append(link)
    run_or_raise(["ip", "link", "set", link, "master", state.spec.bridge, "up"])
    run_or_raise(["ip", "-n", ns, "link", "set", "lo", "up"])
    run_or_raise(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", NODE_IF])
    run_or_raise(["ip", "-n", ns, "link", "set", NODE_IF, "up"])


def start_slurmd(state: SandboxState, node: int) -> None:
    """(Re)start node nK's slurmd in its namespace, with hostname nK and the sandbox's /etc/hosts."""
    folder = Path(state.folder)
    (folder / "state" / f"d-n{node}").mkdir(parents=True, exist_ok=True)  # slurmd does not create it
    script = 'hostname "$1" && mount --bind "$2" /etc/hosts && exec "$3" -N "$1" -f "$4"'
    argv = ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script,
            "sh", f"n{node}", str(folder / "hosts"), SLURMD, str(state.conf)]
    run_or_raise(in_namespace(state.spec.ns(node), argv))


def node_states(state: SandboxState) -> dict[str, str]:
    """Node name -> Slurm state (lower case, e.g. idle, allocated, down*, drained), from `scontrol show node`."""
    done = subprocess.run(["scontrol", "-o", "show", "node"], capture_output=True, text=True, timeout=15,
                          env=slurm_env(state))
    if done.returncode != 0:
        return {}
    states = {}
    for line in done.stdout.splitlines():
        name, node_state = re.search(r"NodeName=(\S+)", line), re.search(r"\bState=(\S+)", line)
        if name and node_state:
            states[name.group(1)] = node_state.group(1).lower()
    return states


def up(spec: SandboxSpec) -> SandboxState:
    """Bring up (or find already up) a sandbox of `spec.nodes` nodes, all idle. Idempotent."""
    _require_host()
    current = load_state(spec.prefix)
    if current is not None:
        if current.spec == spec and _all_idle(current) and accounting.slurmdbd_answers(slurm_env(current)):
            return current
        down(spec.prefix)
    if _net_in_use(spec):
        raise SandboxError(f"{spec.net}.0/24 is already used by an interface on this host; choose another "
                           "--net (three octets of a private /24)")
    started = time.monotonic()
    folder = sandbox_dir(spec.prefix)
    shutil.rmtree(folder / "state", ignore_errors=True)
    shutil.rmtree(folder / "log", ignore_errors=True)
    (folder / "state" / "ctld").mkdir(parents=True)
    (folder / "log").mkdir()
    state = SandboxState(spec=spec, folder=str(folder))
    _save(state)
    try:
        state.munged_pid = _start_munge()
        run_or_raise(["ip", "link", "add", spec.bridge, "type", "bridge"])
        state.links.append(spec.bridge)
        _save(state)
        run_or_raise(["ip", "addr", "add", f"{spec.net}.1/24", "dev", spec.bridge])
        run_or_raise(["ip", "link", "set", spec.bridge, "up"])
        _add_namespace(state, spec.ctl_ns, spec.host_link("c"), f"{spec.net}.2")
        for k in spec.all_nodes:
            _add_namespace(state, spec.ns(k), spec.host_link(k), spec.address(k))
            _save(state)
        state.conf.write_text(_conf_text(spec, folder))
        (folder / "hosts").write_text(_hosts_text(spec))
        try:
            accounting.start_accounting(state, slurm_env(state), wait_until, _save)
        except accounting.AccountingError as exc:
            raise SandboxError(str(exc)) from None
        run_or_raise(in_namespace(spec.ctl_ns, [SLURMCTLD, "-f", str(state.conf)]))
        wait_until(30, "slurmctld to answer `scontrol ping`", lambda: "UP" in subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=15, env=slurm_env(state)).stdout)
        for k in spec.all_nodes:
            start_slurmd(state, k)
        wait_until(60, f"all {len(spec.all_nodes)} nodes idle (see {folder}/log)", lambda: _all_idle(state))
        if spec.prometheus_port:
            state.prometheus_pid = start_prometheus(state, wait_until)
    except Exception:
        _save(state)
        down(spec.prefix)
        raise
    state.bring_up_s = round(time.monotonic() - started, 3)
    _save(state)
    return state


def _all_idle(state: SandboxState) -> bool:
    states = node_states(state)
    return len(states) == len(state.spec.all_nodes) and all(s == "idle" for s in states.values())


def namespace_pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=15)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def signal_pids(pids: list[int], sig: int) -> None:
    """Send `sig` to each of `pids` still running."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def down(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove every namespace, link and process the sandbox recorded, and nothing else. Returns what it removed."""
    state = load_state(prefix)
    if state is None:
        return []
    removed = []
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.5)):
        for ns in state.namespaces:
            signal_pids(namespace_pids(ns), sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(namespace_pids(ns) for ns in state.namespaces):
            time.sleep(0.1)
    for ns in state.namespaces:
        if subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15).returncode == 0:
            removed.append(f"netns {ns}")
    for link in state.links:  # veths went with their namespace; the bridge remains
        if subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=15).returncode == 0:
            removed.append(f"link {link}")
    removed += accounting.stop_accounting(state)
    if state.prometheus_pid and stop_prometheus(state):
        removed.append(f"prometheus {state.prometheus_pid}")
    if state.munged_pid and not _other_slurm_daemons(state):
        try:
            if "munged" in Path(f"/proc/{state.munged_pid}/cmdline").read_text():
                os.kill(state.munged_pid, signal.SIGTERM)
                removed.append(f"munged {state.munged_pid}")
        except (OSError, ValueError):
            pass
    _state_path(prefix).unlink(missing_ok=True)
    return removed


def _other_slurm_daemons(state: SandboxState) -> bool:
    """Another Slurm (a test suite's, a real one) may use the munged we started: then it stays."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] in ("slurmctld", "slurmd") and str(state.conf) not in " ".join(proc.info["cmdline"] or []):
            return True
    return False


def status(prefix: str = DEFAULT_PREFIX) -> dict:
    state = load_state(prefix)
    if state is None:
        return {"up": False}
    return {"up": True, "nodes": node_states(state), "slurm_conf": str(state.conf),
            "namespaces": state.namespaces, "bring_up_s": state.bring_up_s,
            "addresses": {f"n{k}": state.spec.address(k) for k in state.spec.all_nodes},
            "prometheus": prometheus_url(state.spec) if state.prometheus_pid else None,
            "accounting": accounting.accounting_status(state, slurm_env(state))}


def state_for_slurm_conf(conf: str) -> SandboxState | None:
    """The running sandbox whose slurm.conf is `conf`, if any."""
    root = sandbox_dir().parent
    for path in sorted(root.glob("sandbox-*/state.json")) if root.is_dir() else []:
        state = load_state(path.parent.name.removeprefix("sandbox-"))
        if state is not None and conf and Path(conf).resolve() == state.conf.resolve():
            return state
    return None
