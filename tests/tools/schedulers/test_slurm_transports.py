"""The Slurm backend gives the same answers through both transports — the Slurm CLI and pyslurm (built for
this Slurm by tests/services/build_pyslurm.sh) — on a real multi-node `trainops sandbox` cluster."""
from __future__ import annotations

import time

import pytest

from trainops.tools.schedulers.base import JobSpec
from trainops.tools.schedulers.slurm import SlurmScheduler
from trainops.tools.schedulers.slurm_pyslurm import PyslurmTransport
from trainops.tools.schedulers.slurm_transport import (
    CliTransport,
    pyslurm_matches,
    pyslurm_version,
    slurm_release,
    transport_choice,
)
from trainops.workspace import jobs_dir

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(params=["cli", "pyslurm"])
def slurm(request, sandbox_cluster, require_service):
    if request.param == "pyslurm":
        require_service(pyslurm_matches(pyslurm_version(), slurm_release()),
                        "pyslurm built for this Slurm (tests/services/build_pyslurm.sh)")
        return SlurmScheduler(PyslurmTransport())
    return SlurmScheduler(CliTransport())


def _wait_state(slurm, job_id, states, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while (status := slurm.status(job_id)).state not in states:
        assert time.monotonic() < deadline, f"job {job_id} still {status.state} ({status.reason})"
        time.sleep(0.2)
    return status


def test_a_two_node_job_runs_and_reports_its_nodes_exit_code_and_log(slurm, tmp_path):
    spec = JobSpec(name="two-nodes", command=["sh", "-c", "hostname; exit 3"], nodes=2, workdir=str(tmp_path))
    handle = slurm.submit(spec)
    status = _wait_state(slurm, handle.job_id, {"failed", "completed"})
    assert status.state == "failed" and status.exit_code == 3
    assert status.nodes == ["n1", "n2"]
    assert status.started_at and status.ended_at and status.ended_at >= status.started_at


def test_exclude_places_the_job_on_the_spare_and_jobs_and_nodes_are_listed(slurm, tmp_path):
    spec = JobSpec(name="spare", command=["sleep", "30"], nodes=2, exclude_nodes=["n1"], workdir=str(tmp_path))
    handle = slurm.submit(spec)
    status = _wait_state(slurm, handle.job_id, {"running"})
    assert status.nodes == ["n2", "n3"]
    listed = {job.job_id: job for job in slurm.list_jobs()}
    assert listed[handle.job_id].state == "running" and listed[handle.job_id].nodes == ["n2", "n3"]
    nodes = {node.name: node.state for node in slurm.list_nodes()}
    assert nodes["n1"] == "idle" and {nodes["n2"], nodes["n3"]} <= {"allocated", "mixed"}
    cancelled = slurm.cancel(handle.job_id, force=True)
    assert cancelled.state in ("cancelled", "failed")


def test_drain_and_resume_a_node_with_a_reason(slurm):
    drained = slurm.drain("n3", "suspected bad NIC")
    assert drained.state in ("drained", "draining") and drained.reason == "suspected bad NIC"
    assert slurm.resume("n3").state == "idle"


def test_requeue_puts_a_running_job_back_and_it_runs_again(slurm, tmp_path):
    handle = slurm.submit(JobSpec(name="again", command=["sleep", "30"], workdir=str(tmp_path)))
    _wait_state(slurm, handle.job_id, {"running"})
    slurm.requeue(handle.job_id)
    status = _wait_state(slurm, handle.job_id, {"running"}, timeout_s=60)
    assert status.state == "running"
    slurm.cancel(handle.job_id, force=True)


def test_the_transport_is_pyslurm_only_when_it_matches_the_running_slurm(sandbox_cluster, monkeypatch):
    assert pyslurm_matches("22.5.3", "22.05") and not pyslurm_matches("25.11.0", "22.05")
    monkeypatch.setenv("TRAINOPS_SLURM_TRANSPORT", "cli")
    assert transport_choice()[0] == "cli"
    monkeypatch.setenv("TRAINOPS_SLURM_TRANSPORT", "auto")
    expected = "pyslurm" if pyslurm_matches(pyslurm_version(), slurm_release()) else "cli"
    assert transport_choice()[0] == expected


def test_slurm_runs_the_script_it_was_given_not_what_the_file_says_later(slurm, tmp_path):
    """The batch script lies in the workspace, where a job can write: both transports hand Slurm its text
    at submit, so rewriting the file afterwards changes nothing that runs (a run or a requeue)."""
    handle = slurm.submit(JobSpec(name="fixed", command=["sh", "-c", "sleep 2; echo as-submitted"],
                                  workdir=str(tmp_path)))

    for script in jobs_dir().glob("slurm-*.sbatch"):
        script.write_text("#!/bin/bash\necho rewritten\n")
    status = _wait_state(slurm, handle.job_id, {"failed", "completed"})
    log = slurm.logs(handle.job_id)
    assert status.state == "completed" and "as-submitted" in log and "rewritten" not in log



def test_the_operator_s_environment_is_not_handed_to_slurmctld(slurm, sandbox_cluster, monkeypatch, tmp_path):
    """slurmctld keeps the environment a submission carries (StateSaveLocation/hash.N/job.ID/environment):
    a secret in the operator's shell must not travel with the job, through either transport."""
    monkeypatch.setenv("TRAINOPS_TEST_OPERATOR_TOKEN", "sk-operator-secret-4f2a")
    handle = slurm.submit(JobSpec(name="env-kept", command=["sleep", "20"], workdir=str(tmp_path)))
    try:
        _wait_state(slurm, handle.job_id, {"running"})
        kept = list(sandbox_cluster.conf.parent.glob(f"**/hash.*/job.{handle.job_id}/environment"))
        assert kept, f"slurmctld kept no environment file for job {handle.job_id}"
        assert all(b"sk-operator-secret-4f2a" not in path.read_bytes() for path in kept)
        assert all(b"TRAINOPS_TEST_OPERATOR_TOKEN" not in path.read_bytes() for path in kept)
    finally:
        slurm.cancel(handle.job_id)
