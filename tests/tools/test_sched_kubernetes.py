"""Kubernetes manifests checked against the official schema (no API server runs here), and a
live round trip that runs only when KUBECONFIG points at a reachable cluster."""
from __future__ import annotations

import os

import kubernetes_validate
import pytest

from tools.schedulers import JobSpec, SchedulerError
from tools.schedulers.kubernetes import job_manifest, service_manifest

K8S_VERSION = "1.30.0"


def _spec(**kw) -> JobSpec:
    base = dict(name="llama-drill", command=["-m", "trainer.train", "--run-dir", "/runs/r1"], launcher="torchrun",
                nodes=2, procs_per_node=4, image="registry.example/trainops:0.1", env={"OMP_NUM_THREADS": "1"},
                exclude_nodes=["gpu-07"], time_limit_min=30, partition="training")
    return JobSpec(**{**base, **kw})


def test_the_indexed_job_is_valid_against_the_official_schema():
    kubernetes_validate.validate(job_manifest(_spec()), K8S_VERSION, strict=True)


def test_the_headless_service_is_valid_against_the_official_schema():
    kubernetes_validate.validate(service_manifest(_spec()), K8S_VERSION, strict=True)


def test_torchrun_rendezvous_points_at_pod_zero_through_the_headless_service():
    job = job_manifest(_spec())
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--rdzv-endpoint") + 1] == "llama-drill-0.llama-drill.training.svc:29500"
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    assert job["spec"]["template"]["spec"]["subdomain"] == service_manifest(_spec())["metadata"]["name"]


def test_excluded_nodes_become_a_node_affinity_and_the_limit_a_deadline():
    job = job_manifest(_spec())
    term = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0] == {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-07"]}
    assert job["spec"]["activeDeadlineSeconds"] == 1800


def test_a_spec_without_an_image_names_the_field():
    with pytest.raises(SchedulerError, match="JobSpec.image is empty"):
        job_manifest(_spec(image=None))


def _cluster_reachable() -> tuple[bool, str]:
    if not os.environ.get("KUBECONFIG"):
        return False, "KUBECONFIG is not set: no Kubernetes cluster to test against (not a CI service)"
    try:
        from kubernetes import client, config

        config.load_kube_config()
        client.VersionApi().get_code(_request_timeout=5)
    except Exception as exc:
        return False, f"the cluster in KUBECONFIG is not reachable: {exc}"
    return True, ""


def test_a_plain_job_runs_on_a_live_cluster():
    ok, why = _cluster_reachable()
    if not ok:
        pytest.skip(why)
    from tools.schedulers import get_scheduler

    sched = get_scheduler("kubernetes")
    handle = sched.submit(JobSpec(name="trainops-live-check", command=["python", "-c", "print('ok')"], image="python:3.11-slim"))
    try:
        assert sched.wait(handle.job_id, timeout_s=300).state == "completed"
        assert "ok" in sched.logs(handle.job_id)
    finally:
        sched.cancel(handle.job_id)
