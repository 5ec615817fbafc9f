"""`trainops sandbox`: a real Slurm cluster of network-namespace nodes on this host (root; Linux).
Each test brings a fresh cluster up and down (about a second each way)."""
from __future__ import annotations

import json
import subprocess

import psutil
import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.sandbox import cluster as sandbox
from trainops.tools.sandbox import faults as sandbox_faults

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _srun(state, *args: str) -> list[str]:
    done = subprocess.run(["srun", *args], capture_output=True, text=True, timeout=60, env=sandbox.slurm_env(state))
    assert done.returncode == 0, done.stderr
    return sorted(done.stdout.split())


def test_up_brings_three_idle_nodes_that_run_a_two_node_job_on_their_own_addresses(sandbox_cluster):
    # n4 and n5 are the shadow partition's nodes of its own
    assert sandbox.node_states(sandbox_cluster) == {"n1": "idle", "n2": "idle", "n3": "idle", "n4": "idle",
                                                    "n5": "idle"}
    assert _srun(sandbox_cluster, "-N2", "hostname") == ["n1", "n2"]
    addresses = _srun(sandbox_cluster, "-N3", "sh", "-c", "ip -4 -o addr show tos0 | awk '{print $4}'")
    assert addresses == ["10.251.8.11/24", "10.251.8.12/24", "10.251.8.13/24"]


def test_up_again_is_idempotent_and_down_removes_only_what_the_sandbox_made(sandbox_cluster):
    assert sandbox.up(sandbox_cluster.spec) == sandbox_cluster
    subprocess.run(["ip", "netns", "add", "decoy-ns"], check=True)
    subprocess.run(["ip", "link", "add", "decoyh1", "type", "bridge"], check=True)
    try:
        removed = sandbox.down("tost")
        assert "netns tost-n1" in removed and "link tostbr0" in removed
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "decoy-ns" in netns and "tost-" not in netns
        assert "decoyh1" in links and "tostbr0" not in links and "tosth" not in links
        assert not any(sandbox_cluster.folder in " ".join(p.info["cmdline"] or []) for p in _slurm_processes())
        assert sandbox.down("tost") == []
    finally:
        subprocess.run(["ip", "netns", "del", "decoy-ns"])
        subprocess.run(["ip", "link", "del", "decoyh1"])


def _slurm_processes():
    return [p for p in psutil.process_iter(["name", "cmdline", "status"])
            if p.info["name"] in ("slurmd", "slurmctld", "slurmstepd") and p.info["status"] != psutil.STATUS_ZOMBIE]


def test_node_faults_crash_one_node_shape_its_link_and_bring_it_back(sandbox_cluster):
    killed = sandbox_faults.crash_node(2, prefix="tost")
    assert killed and not sandbox_faults._alive(killed)
    assert sandbox.namespace_pids("tost-n1") and sandbox.namespace_pids("tost-n3")
    sandbox_faults.slow_link(3, 1.0, prefix="tost")
    shown = subprocess.run(["tc", "qdisc", "show", "dev", "tosth3"], capture_output=True, text=True).stdout
    assert "tbf" in shown and "1Mbit" in shown
    sandbox_faults.slow_link(3, None, prefix="tost")
    assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", "tosth3"], capture_output=True, text=True).stdout
    sandbox_faults.heal_node(2, prefix="tost")
    sandbox.wait_until(30, "n2 idle again", lambda: sandbox.node_states(sandbox_cluster).get("n2") == "idle")


def test_bad_settings_are_named_and_the_cli_reports_status():
    runner = CliRunner()
    bad = runner.invoke(app, ["sandbox", "up", "--nodes", "0", "--json"])
    assert bad.exit_code == 2 and "nodes" in json.loads(bad.stdout)["error"]
    public = runner.invoke(app, ["sandbox", "up", "--net", "8.8.8", "--json"])
    assert public.exit_code == 2 and "not a private range" in json.loads(public.stdout)["error"]
    assert json.loads(runner.invoke(app, ["sandbox", "status", "--prefix", "nosuch", "--json"]).stdout) == {"up": False}
