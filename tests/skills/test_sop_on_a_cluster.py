"""`trainops sop --scheduler slurm --nodes N --partition P --monitor prometheus`, S1 (issue 42 item 1, first
slice): the settings refuse what cannot run, naming the field and the fix; S1 declares the job's partition and
nodes, the all-reduce bandwidth measured between nodes, the hot spares the scheduler really has (idle nodes of
the partition beyond the job's own; none on one host) and the shadow partition, and checks that the
Prometheus it names answers. The sandbox tests run S1, then the whole quick SOP, for real on a 3-node Slurm
cluster with its Prometheus: every job in the partition, and a node loss among the drills (next slice)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.conftest import free_port
from trainops.cli import app
from trainops.skills.drill.restart import isolate_node
from trainops.skills.environment import placement
from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.request import JobRequest
from trainops.skills.sop_session import NODE_LOSS, SopSession, SopSettings, load, sessions_dir
from trainops.tools.base import ToolError
from trainops.tools.environment.env import SchedulerDeclaration
from trainops.tools.environment.probes import partition_of
from trainops.tools.jobs.trainer_job import training_spec
from trainops.tools.reliability.signals import Detection
from trainops.tools.sandbox.metrics import prometheus_url
from trainops.tools.schedulers.base import NodeInfo


def sop(*args: str):
    return CliRunner().invoke(app, ["sop", *args, "--json"])


def declare(payload: dict):
    return CliRunner().invoke(app, ["tool", "call", "sop_declare", "--input", json.dumps(payload), "--json"])


def one_line(result) -> str:
    return " ".join(result.output.split())


def slurm(idle: list[str], shadow: str | None = "shadow") -> SchedulerDeclaration:
    """A Slurm cluster as read_scheduler declares it: partition sandbox n1..n3 (default), shadow n4, n5."""
    return SchedulerDeclaration(kind="slurm", version="slurm 22.05.8", partitions=["sandbox", "shadow"],
                                default_partition="sandbox", nodes=["n1", "n2", "n3"], hot_spare_nodes=idle,
                                partition_nodes={"sandbox": ["n1", "n2", "n3"], "shadow": ["n4", "n5"]},
                                shadow_partition=shadow, shadow_nodes=["n4", "n5"],
                                cpus_per_node={"n1": 2, "n2": 2, "n3": 2})


def test_more_than_one_node_needs_slurm_in_the_settings_and_on_the_command_line():
    with pytest.raises(ValidationError, match=r"nodes=2 needs scheduler='slurm' \(got 'local'\)"):
        SopSettings(nodes=2)
    result = sop("--nodes", "2")
    assert result.exit_code == 2
    assert "nodes=2 needs scheduler='slurm' (got 'local')" in one_line(result)
    assert "`trainops sandbox up` makes a Slurm cluster" in one_line(result)


def test_a_partition_needs_slurm():
    with pytest.raises(ValidationError, match="partition='gpu' needs scheduler='slurm'"):
        SopSettings(partition="gpu", scheduler="kubernetes")
    result = sop("--partition", "gpu")
    assert result.exit_code == 2 and "partition='gpu' needs scheduler='slurm' (got 'local')" in one_line(result)


def test_the_step_tool_refuses_the_same_settings_before_anything_runs(workspace):
    result = declare({"quick": True, "nodes": 3})
    assert result.exit_code == 2 and "nodes=3 needs scheduler='slurm'" in one_line(result)
    assert not list(sessions_dir().glob("*.json"))


def test_a_partition_the_cluster_does_not_have_is_refused_naming_sinfo():
    with pytest.raises(ToolError, match=r"partition='gpu' does not exist on this cluster: `sinfo` lists sandbox, "
                                        r"shadow; name one of those, or omit partition for the default \(sandbox\)"):
        partition_of(slurm(idle=["n1", "n2", "n3"]), "gpu")


def test_the_spares_are_the_partitions_idle_nodes_beyond_the_jobs_own():
    found = placement(SimpleNamespace(scheduler=slurm(idle=["n1", "n2", "n3"])), "sandbox", 2)
    assert found["hot_spare_nodes"] == ["n3"] and found["hot_spares"] == 1
    assert found["partition_nodes"] == ["n1", "n2", "n3"] and found["partition_cpus"] == 6
    assert found["shadow_partition"] == "shadow"
    busy = placement(SimpleNamespace(scheduler=slurm(idle=["n2", "n3"], shadow=None)), None, 2)
    assert busy["partition"] == "sandbox" and busy["hot_spare_nodes"] == [], "n1 is busy: no idle node is left over"
    assert busy["shadow_partition"] == "none"


def test_a_job_larger_than_its_partition_is_refused():
    with pytest.raises(ToolError, match=r"nodes=4: partition 'sandbox' has 3 node\(s\) \(n1, n2, n3\), so the job "
                                        "can never start"):
        placement(SimpleNamespace(scheduler=slurm(idle=["n1"])), "sandbox", 4)


def test_a_prometheus_that_does_not_answer_is_refused_at_s1_with_the_fix(workspace, monkeypatch):
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", f"http://127.0.0.1:{free_port()}")
    result = declare({"quick": True, "monitor": "prometheus"})
    text = one_line(result)
    assert result.exit_code == 2, text
    assert "monitor=prometheus: prometheus monitor: query 'up'" in text and "failed" in text
    assert "$TRAINOPS_PROMETHEUS_URL" in text and "or use monitor=embedded" in text
    assert not list(sessions_dir().glob("*.json")), "nothing was declared"


def test_one_host_declares_no_spare_no_partition_and_says_there_is_no_shadow_partition(workspace):
    result = declare({"quick": True})
    assert result.exit_code == 0, result.output
    env = load(json.loads(result.output)["session_id"]).environment
    assert env.hot_spares == 0 and env.hot_spare_nodes == [], "the host the job runs on is not its own spare"
    assert env.partition is None and env.shadow_partition == "none" and env.monitor == "embedded"
    assert env.inter_node_gbit_s is None, "one node: no cross-node figure is claimed"


def test_a_job_request_carries_its_partition_into_the_spec_and_only_on_slurm(workspace):
    with pytest.raises(ValidationError, match="partition='gpu' needs scheduler='slurm' \\(got 'local'\\)"):
        JobRequest(partition="gpu")
    with pytest.raises(ValidationError, match="partition"):
        JobRequest(scheduler="slurm", partition="gpu; rm -rf /")
    req = JobRequest(scheduler="slurm", partition="gpu", nodes=2, nproc=1, overrides=["training.steps=2"])
    spec = training_spec(req.loaded(), "p", [])
    assert spec.partition == "gpu" and spec.nodes == 2


def test_every_sop_job_runs_in_the_declared_partition_and_a_cluster_drills_a_node_loss():
    settings = SopSettings(scheduler="slurm", nodes=2, partition="sandbox", quick=True)
    assert settings.request().partition == "sandbox"
    assert settings.drills() == [NODE_LOSS], "the quick SOP on a cluster drills the node loss"
    assert NODE_LOSS in SopSettings(scheduler="slurm", nodes=2).drills()
    assert SopSettings(quick=True).drills() == ["crash"], "one host: no node to lose"
    assert SopSettings(scheduler="slurm", nodes=2, quick=True, faults=["hang"]).drills() == ["hang"]
    default = SopSession.model_construct(session_id="s", settings=SopSettings(scheduler="slurm", nodes=2, quick=True),
                                         environment=SimpleNamespace(partition="sandbox"), framework_version="v")
    assert default.request().partition == "sandbox", "no --partition: the default one S1 read from sinfo"


def test_a_node_drill_drains_the_lost_node_only_where_its_partition_has_a_spare(monkeypatch):
    """The shadow partition's idle nodes are no spare for a job of partition sandbox: the restart can't run there."""
    calls = []

    def fake(tool, inp, ctx=None):
        calls.append(tool.__name__)
        return SimpleNamespace(nodes=[NodeInfo(name="n1", state="allocated", partitions=["sandbox"]),
                                      NodeInfo(name="n2", state="down", partitions=["sandbox"]),
                                      NodeInfo(name="n4", state="idle", partitions=["shadow"])])
    monkeypatch.setattr("trainops.skills.drill.restart.invoke", fake)
    lost = Detection(detected=True, mechanism="process_exit", node="n2", isolation="node")
    assert isolate_node(lost, ["n1", "n2"], "slurm", None, "sandbox") is None and calls == ["list_nodes"]
    assert isolate_node(lost, ["n1", "n2"], "slurm", None) == "n2", "no partition named: any idle node is a spare"


@pytest.mark.services
@pytest.mark.slow
def test_s1_on_slurm_measures_the_interconnect_and_declares_the_real_spares_and_the_shadow_partition(
        sandbox_cluster, monkeypatch):
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", prometheus_url(sandbox_cluster.spec))
    missing = declare({"quick": True, "scheduler": "slurm", "nodes": 2, "partition": "gpu"})
    assert missing.exit_code == 2 and "partition='gpu' does not exist on this cluster: `sinfo` lists" in \
        one_line(missing)

    result = declare({"quick": True, "scheduler": "slurm", "nodes": 2, "partition": "sandbox",
                      "monitor": "prometheus"})
    assert result.exit_code == 0, result.output
    session = load(json.loads(result.output)["session_id"])
    env = session.environment
    assert env.partition == "sandbox" and env.partition_nodes == ["n1", "n2", "n3"] and env.job_nodes == 2
    assert env.inter_node_gbit_s > 0 and env.inter_node_latency_us > 0
    assert len(set(env.inter_node_measured_on)) == 2 and set(env.inter_node_measured_on) <= {"n1", "n2", "n3"}
    assert env.hot_spare_nodes == ["n3"] and env.hot_spares == 1, "3 idle nodes, the job takes 2: one spare"
    assert env.shadow_partition == "shadow"
    assert env.monitor.startswith(f"prometheus at {prometheus_url(sandbox_cluster.spec)}")
    assert env.checkpoint_write_gib_per_s > 0
    assert session.settings.nodes == 2 and session.target_world() == 2 * session.settings.request().nproc
    assert "partition sandbox" in session.steps[0].result and "shadow partition shadow" in session.steps[0].result


@pytest.mark.services
@pytest.mark.slow
def test_the_quick_sop_runs_end_to_end_on_two_nodes_of_the_partition_with_a_node_loss_drill(
        sandbox_cluster, workspace, monkeypatch):
    """Issue 42 item 1's done-when: `trainops sop --scheduler slurm --nodes 2 --partition sandbox --monitor
    prometheus --quick` on the sandbox writes a pack whose S1 has the measured interconnect and the real spares,
    whose drills include a node loss, and every job of which Slurm ran in the partition."""
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", prometheus_url(sandbox_cluster.spec))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = sop("--scheduler", "slurm", "--nodes", "2", "--partition", "sandbox", "--monitor", "prometheus",
                 "--quick")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    pack = evidence_pack.load(Path(out["pack_dir"]))
    env = pack.environment
    assert env.partition == "sandbox" and env.job_nodes == 2
    assert env.inter_node_gbit_s > 0 and len(set(env.inter_node_measured_on)) == 2
    assert env.hot_spare_nodes == ["n3"] and env.hot_spares == 1, "n1..n3 idle, the job takes 2: one spare"
    node_loss = [d for d in pack.fault_tolerance.drills if d.fault == NODE_LOSS]
    assert node_loss, [d.fault for d in pack.fault_tolerance.drills]
    assert node_loss[0].detection_latency_s > 0 and node_loss[0].recovery_time_s > 0
    session = load(out["session_id"])
    assert [s.step for s in session.steps][:3] == ["S1", "S2", "S3"] and session.steps[-1].step == "S6"
    ladder = [(a.world, a.row.verdict) for a in session.arms]
    assert ladder[0][0] == 1, "the arm's small rung (one process) ran first"
    assert ladder[-1][0] == 2 or session.arms[0].stopped, f"a gain at 1 process climbs to the 2 nodes: {ladder}"
    assert session.target_world() in session.baselines
    accounting = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,JobName,Partition,NNodes"],
                                capture_output=True, text=True, check=True).stdout.splitlines()
    jobs = [line.split("|") for line in accounting if line.strip()]
    assert len(jobs) >= 6, accounting
    assert {partition for _, _, partition, _ in jobs} == {"sandbox"}, accounting
    assert any(int(nodes) == 2 for *_, nodes in jobs), "the target rung ran on two nodes"
