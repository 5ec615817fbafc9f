"""declare_environment against a real one-node Slurm (munged + slurmctld + slurmd on this host).

The cluster is started with the integration suite's helpers (tests/integration/conftest.py), so
there is one way to run Slurm in tests; it skips where Slurm is absent and fails under CI=true.
"""
from __future__ import annotations

import importlib.util
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from trainops.tools.calls import call

pytestmark = pytest.mark.services


def _integration_helpers():
    path = Path(__file__).resolve().parents[2] / "integration" / "conftest.py"
    spec = importlib.util.spec_from_file_location("trainops_integration_services", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def slurm_conf():
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sinfo")
               if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())]
    if missing:
        yield None, f"Slurm/munge binaries not installed ({', '.join(missing)}); run tests/services/install.sh"
        return
    helpers = _integration_helpers()
    helpers.start_munge()
    state_dir = Path(tempfile.mkdtemp(prefix="trainops-env-slurm-"))
    cluster = helpers.SlurmCluster(state_dir)
    cluster.start()
    yield cluster.conf, ""
    cluster.stop()
    shutil.rmtree(state_dir, ignore_errors=True)


def test_slurm_declaration_reports_version_partition_and_the_idle_node(slurm_conf, require_service, monkeypatch):
    conf, why = slurm_conf
    require_service(conf is not None, why)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    out = call("declare_environment", {"scheduler": "slurm", "ckpt_test_mib": 2, "measure_gemm": False})
    assert out.scheduler.version.startswith("slurm")
    # the test cluster's two partitions (tests/integration/conftest.py: `urgent` preempts `debug`)
    assert out.scheduler.partitions == ["debug", "urgent"] and out.scheduler.nodes == [socket.gethostname()]
    assert out.scheduler.hot_spare_nodes == [socket.gethostname()]
