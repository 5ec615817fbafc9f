"""Real services for the integration tests, started once per session and stopped after:
munged, slurmctld + slurmd (one node: this host, its real CPU count) and Prometheus on
127.0.0.1. Where a binary is missing the tests skip and say why; under CI=true (where
.ci/run installs them) that is a failure, through the `require_service` fixture."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from trainops.tools.sandbox import cluster as sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def start_munge() -> None:
    """A working munged, started (with its key) if none answers and left running: the sandbox, the
    accounting and the single-node Slurm use it side by side (tests/conftest.py)."""
    sandbox._start_munge()


def write_slurm_conf(state_dir: Path) -> Path:
    host = socket.gethostname()
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    conf = state_dir / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=trainops-test", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "ReturnToService=2", "MinJobAge=3600", "JobRequeue=1", "MessageTimeout=5", "KillWait=5",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={state_dir}/ctld", f"SlurmdSpoolDir={state_dir}/d",
        f"SlurmctldPidFile={state_dir}/slurmctld.pid", f"SlurmdPidFile={state_dir}/slurmd.pid",
        f"SlurmctldLogFile={state_dir}/slurmctld.log", f"SlurmdLogFile={state_dir}/slurmd.log",
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory={int(mem_mb * 0.8)} State=UNKNOWN",
        # a job in `urgent` preempts (cancels) one in `debug` it needs the cores of: Slurm's PREEMPTED end
        "PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
        f"PartitionName=urgent Nodes={host} MaxTime=INFINITE State=UP PriorityTier=2",
    ]) + "\n")
    (state_dir / "ctld").mkdir(exist_ok=True)
    (state_dir / "d").mkdir(exist_ok=True)
    return conf


def _node_idle(env: dict) -> bool:
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env)
    return out.returncode == 0 and out.stdout.strip() == "idle"


def _stop_pidfile(path: Path) -> None:
    try:
        os.kill(int(path.read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


class SlurmCluster:
    """A one-node Slurm on this host, configured through SLURM_CONF."""
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.conf = write_slurm_conf(state_dir)
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.host = socket.gethostname()

    def start_controller(self) -> None:
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(self.conf)], env=self.env, check=True, capture_output=True)
        _wait(lambda: subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True,
                                     text=True).stdout.count("UP") > 0,
              20, "slurmctld to answer `scontrol ping`")

    def start(self) -> None:
        self.start_controller()
        subprocess.run(["/usr/sbin/slurmd", "-f", str(self.conf)], env=self.env, check=True, capture_output=True)
        self.wait_idle()

    def wait_idle(self, timeout_s: float = 30) -> None:
        _wait(lambda: _node_idle(self.env), timeout_s, f"node {self.host} to be idle in sinfo")

    def stop_controller(self) -> None:
        _stop_pidfile(self.state_dir / "slurmctld.pid")
        _wait(lambda: subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True,
                                     text=True).stdout.count("UP") == 0,
              20, "slurmctld to stop")

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True)
        _stop_pidfile(self.state_dir / "slurmd.pid")
        _stop_pidfile(self.state_dir / "slurmctld.pid")


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch")
               if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())]
    if missing:
        yield None, f"Slurm/munge binaries not installed ({', '.join(missing)}); run tests/services/install.sh"
        return
    start_munge()
    state_dir = Path(tempfile.mkdtemp(prefix="trainops-slurm-"))
    cluster = SlurmCluster(state_dir)
    cluster.start()
    yield cluster, ""
    cluster.stop()
    shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster, require_service, monkeypatch):
    """The session's Slurm cluster, with SLURM_CONF pointing at it for this test."""
    cluster, why = slurm_cluster
    require_service(cluster is not None, why)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return cluster


class PrometheusServer:
    """Prometheus on 127.0.0.1 (a free port, 1 s scrapes) whose targets come from a file_sd
    file: `scrape_run(run_dir)` points it at a run's exporters.json."""
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = state_dir / "targets.json"
        self.targets.write_text("[]")
        config = state_dir / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "trainops",
                                "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}]}],
        }))
        self.log = open(state_dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
             f"--storage.tsdb.path={state_dir / 'data'}"], stdout=self.log, stderr=subprocess.STDOUT)
        _wait(self._ready, 30, f"Prometheus at {self.url}/-/ready")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def scrape_run(self, run_dir: Path, ranks: int, timeout_s: float = 120) -> None:
        """Wait for the run's exporters to register, then add them as targets."""
        path = Path(run_dir) / "exporters.json"
        _wait(lambda: path.exists() and len(json.loads(path.read_text() or "{}")) >= ranks, timeout_s,
              f"{ranks} exporters in {path}")
        addresses = sorted(json.loads(path.read_text()).values())
        self.targets.write_text(json.dumps([{"targets": addresses}]))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture(scope="session")
def prometheus_server():
    if not shutil.which("prometheus"):
        yield None, "prometheus is not installed; run tests/services/install.sh"
        return
    state_dir = Path(tempfile.mkdtemp(prefix="trainops-prometheus-"))
    server = PrometheusServer(state_dir)
    yield server, ""
    server.stop()
    shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def prometheus(prometheus_server, require_service, monkeypatch):
    """The session's Prometheus, configured for this test (query_metrics talks only to configured servers)."""
    server, why = prometheus_server
    require_service(server is not None, why)
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", server.url)
    return server
