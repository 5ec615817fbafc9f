"""Shared test set-up: every test gets its own workspace; real-service tests skip locally
and fail under CI=true (where .ci/run has installed and started the services)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainops.tools.context import operator_session
from trainops.tools.sandbox import accounting
from trainops.tools.sandbox import cluster as sandbox

# A real service's tests share its state (a cluster's queue and nodes, an accounting database), so they
# run one after another on one pytest-xdist worker (`--dist loadgroup`, the Makefile's `make test`): a
# group per service. Different services run side by side: each has ports, folders and names of its own
# (the sandbox's prefix, namespaces, /24 and ports; the single-node Slurm's, the accounting's and the
# test Prometheus's free ports), and munged, which they all use, is started once and left running
# (tests/integration/conftest.start_munge). Every other test is spread over the workers.
SERVICE_GROUPS = (("sandbox_cluster", "sandbox"), ("slurm_accounting", "accounting"),
                  ("_accounting_service", "accounting"), ("slurm", "slurm"), ("slurm_cluster", "slurm"),
                  ("prometheus", "prometheus"), ("prometheus_server", "prometheus"))
HOST_WIDE_MODULES = (("tests/tools/sandbox/", "sandbox"), ("tests/integration/test_multinode.py", "sandbox"),
                     ("tests/integration/test_multinode_network.py", "sandbox"),
                     ("tests/integration/test_sdc_sandbox.py", "sandbox"),
                     ("tests/integration/test_shadow_queue.py", "sandbox"),
                     ("tests/integration/test_quotas_slurm.py", "sandbox"),
                     ("tests/integration/test_ladder_on_nodes.py", "sandbox"),
                     ("tests/tools/environment/test_env_multinode.py", "sandbox"),
                     ("tests/integration/test_slurm_training.py", "slurm"),
                     ("tests/integration/test_slurm_job_ends.py", "slurm"),
                     ("tests/tools/environment/test_env_slurm.py", "slurm"),
                     ("tests/tools/schedulers/test_slurm_transports.py", "slurm"))
"""A module's tests that reach its service without the fixture (a second cluster of their own, a
sandbox brought up by hand) go in that service's group."""

# Tests that judge a measured speed-up (the rollout ladder's gain or no gain): beside other tests'
# training runs the measurement is noise, so `make test` runs them alone, after the parallel pass.
QUIET_MODULES = ("tests/skills/test_rollout_ladder.py", "tests/skills/test_scaling_named_right.py",
                 "tests/integration/test_ladder_on_nodes.py")


def _shared_run(item) -> str | None:
    """The group of a test that reads a module- or session-scoped fixture of ours (a real SOP, a trained
    layout): pytest-xdist sets such a fixture up once per worker that runs one of its tests, so spread
    over three workers its training ran three times; grouped, it runs once."""
    info = getattr(item, "_fixtureinfo", None)
    for name in sorted(info.names_closure if info else ()):
        defs = info.name2fixturedefs.get(name) or ()
        if defs and defs[-1].baseid and defs[-1].scope in ("module", "session"):
            return name if defs[-1].scope == "session" else defs[-1].baseid
    return None


def service_group(item, module: str) -> str | None:
    """The service whose state the test shares, if any: by the fixture it asks for, else by its module."""
    names = set(item.fixturenames)
    return (next((group for fixture, group in SERVICE_GROUPS if fixture in names), None)
            or next((group for prefix, group in HOST_WIDE_MODULES if module.startswith(prefix)), None))


def pytest_itemcollected(item):
    """Runs as each test is collected, so the group is there before pytest-xdist reads it."""
    module = Path(str(item.path)).relative_to(Path(str(item.config.rootpath))).as_posix()
    service = service_group(item, module)
    shared = None if service else _shared_run(item)
    if shared is not None:  # e.g. Chromium reading the quick SOP's pack: a real program, no host-wide state
        item.add_marker(pytest.mark.xdist_group(shared))
    elif service:
        item.add_marker(pytest.mark.xdist_group(service))
    if module in QUIET_MODULES:
        item.add_marker(pytest.mark.quiet)


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch):
    """A fresh $TRAINOPS_HOME (and receipts and record-keys folders) per test, so tests never share state."""
    home = tmp_path / "trainops-home"
    monkeypatch.setenv("TRAINOPS_HOME", str(home))
    monkeypatch.setenv("TRAINOPS_RECEIPTS_DIR", str(tmp_path / "receipts"))
    monkeypatch.setenv("TRAINOPS_KEYS_DIR", str(tmp_path / "keys"))
    return home


def _require(available: bool, why: str) -> None:
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"real service missing under CI=true: {why}")
    pytest.skip(why)


@pytest.fixture
def require_service():
    """`require_service(available, why)`: skip a real-service test where the service is absent,
    saying why; under CI=true that is a failure, because .ci/run starts every service."""
    return _require


@dataclass(frozen=True)
class Approver:
    principal: str
    key: Path  # the private key (no passphrase); `key.with_suffix(".pub")` is its public half


@dataclass(frozen=True)
class Approvers:
    alice: Approver
    bob: Approver
    allowed_signers: Path
    config: Path


def make_ssh_key(folder: Path, name: str) -> Path:
    """A throwaway ed25519 key pair made by ssh-keygen, as a human approver would have."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key


@pytest.fixture
def approvers(tmp_path, monkeypatch) -> Approvers:
    """Two human approvers (alice, bob) with their own keys outside the workspace, an
    allowed-signers file (0644 in a 0755 folder) listing them, and a user config
    ($TRAINOPS_CONFIG) naming that file under [governance] allowed_signers."""
    root = tmp_path / "approvers"
    keys = {name: make_ssh_key(root / "keys", name) for name in ("alice", "bob")}
    signers = root / "etc" / "allowed_signers"
    signers.parent.mkdir(parents=True)
    signers.write_text("".join(f"{name} {' '.join(key.with_suffix('.pub').read_text().split()[:2])}\n"
                               for name, key in keys.items()))
    signers.chmod(0o644)
    signers.parent.chmod(0o755)
    config = root / "config.toml"
    config.write_text(f'[governance]\nallowed_signers = "{signers}"\n')
    monkeypatch.setenv("TRAINOPS_CONFIG", str(config))
    monkeypatch.delenv("TRAINOPS_ALLOWED_SIGNERS", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # never sign with the developer's own agent
    return Approvers(alice=Approver("alice", keys["alice"]), bob=Approver("bob", keys["bob"]),
                     allowed_signers=signers, config=config)


@pytest.fixture
def sandbox_cluster(require_service, monkeypatch):
    """A 3-node `trainops sandbox` Slurm cluster (root; Linux) with its Prometheus, on a prefix, /24 and
    ports of its own, so a developer's own sandbox is left alone; SLURM_CONF and GLOO_SOCKET_IFNAME point at it."""
    require_service(os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "slurmd", "slurmctld", "munged",
                                                                         "mariadbd", "slurmdbd")),
                    "the sandbox needs root, iproute2 and Debian's slurm-wlm, munge, mariadb-server and slurmdbd")
    sandbox._start_munge()  # the tests' own munged, left running for the other services' tests: down keeps it
    state = sandbox.up(sandbox.SandboxSpec(nodes=3, prefix="tost", net="10.251.8", prometheus_port=17890))
    monkeypatch.setenv("SLURM_CONF", str(state.conf))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", sandbox.NODE_IF)
    yield state
    sandbox.down("tost")


@pytest.fixture
def as_operator():
    """The test is the operator at the CLI: tool calls that name no actor are the operator's, as in
    `trainops` commands (without it they are the agent's and need a human's token; see
    tests/security/test_gate_paths.py). Use with `pytestmark = pytest.mark.usefixtures("as_operator")`."""
    with operator_session():
        yield


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    """Poll `condition` until it holds; the test fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def shm_segments() -> set[str]:
    """trainops' shared-memory buffers on this host now."""
    return {p.name for p in Path("/dev/shm").glob("trainops-*")}


def leaked_shm_segments(before: set[str], grace_s: float = 10.0) -> set[str]:
    """The buffers made since `before` that no live process maps: what a finished job left behind.
    A buffer another test's live job maps is that job's (tests run side by side under xdist); one
    being removed gets `grace_s` to go."""
    deadline = time.monotonic() + grace_s
    while True:
        leaked = shm_segments() - before - _mapped_shm()
        if not leaked or time.monotonic() > deadline:
            return leaked
        time.sleep(0.2)


def _mapped_shm() -> set[str]:
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        names.update(line.rsplit("/", 1)[-1] for line in text.splitlines() if "/dev/shm/trainops-" in line)
    return names


@pytest.fixture(scope="session")
def _accounting_service(tmp_path_factory):
    """A real Slurm accounting for the session, started only when a test asks: the sandbox's MariaDB +
    slurmdbd (tools/sandbox/accounting.py) on free ports, and a slurmctld that registers
    the cluster and its TRES (gres/gpu) with slurmdbd, then stops. None where a binary is missing."""
    binaries = (accounting.MARIADBD, accounting.INSTALL_DB, accounting.SLURMDBD, sandbox.SLURMCTLD, sandbox.MUNGED)
    if os.geteuid() != 0 or not all(Path(binary).exists() for binary in binaries):
        yield None
        return
    folder = tmp_path_factory.mktemp("accounting")
    (folder / "state").mkdir()
    (folder / "log").mkdir()
    spec = SimpleNamespace(prefix="tacct", net="127.0.0", dbd_port=free_port(), mariadb_port=free_port())
    state = SimpleNamespace(spec=spec, folder=str(folder), conf=folder / "slurm.conf", mariadb_pid=None,
                            slurmdbd_pid=None)
    state.conf.write_text("\n".join([
        f"ClusterName={accounting.cluster_name(spec)}", f"SlurmctldHost={socket.gethostname().split('.')[0]}",
        f"SlurmctldPort={free_port()}", "SlurmUser=root", "AuthType=auth/munge",
        f"StateSaveLocation={folder / 'state'}", f"SlurmctldPidFile={folder / 'state' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}", *accounting.conf_lines(spec),
        "NodeName=tacct1 NodeAddr=127.0.0.1 CPUs=1 State=FUTURE", "PartitionName=p Nodes=tacct1",
    ]) + "\n")
    env = {**os.environ, "SLURM_CONF": str(state.conf)}
    sandbox._start_munge()  # left running: the other services' tests use it side by side
    ctld_pid = folder / "state" / "slurmctld.pid"
    try:
        accounting.start_accounting(state, env, sandbox.wait_until, lambda _state: None)
        subprocess.run([sandbox.SLURMCTLD, "-f", str(state.conf)], check=True, timeout=30)
        sandbox.wait_until(30, "slurmctld to register the cluster's TRES", lambda: "gres|gpu" in subprocess.run(
            ["sacctmgr", "-n", "-p", "show", "tres", "format=type,name"], capture_output=True, text=True,
            env=env, timeout=15).stdout)
        os.kill(int(ctld_pid.read_text()), signal.SIGTERM)  # its work is done: sacctmgr talks to slurmdbd only
        ctld_pid.unlink(missing_ok=True)
        yield state
    finally:
        if ctld_pid.is_file():
            os.kill(int(ctld_pid.read_text()), signal.SIGTERM)
            time.sleep(0.5)
        accounting.stop_accounting(state)


@pytest.fixture
def slurm_accounting(_accounting_service, require_service, monkeypatch):
    """Real Slurm accounting (MariaDB + slurmdbd) for the tools that set quotas; SLURM_CONF points at it.
    Tenants made by one test stay for the session's next ones (use a tenant of the test's own)."""
    require_service(_accounting_service is not None,
                    "Slurm accounting needs root and Debian's mariadb-server, slurmdbd, slurm-wlm and munge")
    monkeypatch.setenv("SLURM_CONF", str(_accounting_service.conf))
    return _accounting_service
