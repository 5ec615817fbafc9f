"""Kubernetes manifests checked against the official schema (no API server runs here), and a
live round trip that runs only when KUBECONFIG points at a reachable cluster."""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
from kubernetes import client, config

from trainops.tools.schedulers import JobSpec, SchedulerError, get_scheduler
from trainops.tools.schedulers.kubernetes import job_manifest, service_manifest

K8S_VERSION = "1.30.0"


def _spec(**kw) -> JobSpec:
    base = dict(name="llama-drill", command=["-m", "trainops.trainer.train", "--run-dir", "/runs/r1"],
                launcher="torchrun",
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
    affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    term = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0] == {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-07"]}
    assert job["spec"]["activeDeadlineSeconds"] == 1800


def test_a_spec_without_an_image_names_the_field():
    with pytest.raises(SchedulerError, match="JobSpec.image is empty"):
        job_manifest(_spec(image=None))


def _cluster_reachable() -> tuple[bool, str]:
    if not os.environ.get("KUBECONFIG"):
        return False, "KUBECONFIG is not set: no Kubernetes cluster to test against (not a CI service)"
    try:
        config.load_kube_config()
        client.VersionApi().get_code(_request_timeout=5)
    except Exception as exc:
        return False, f"the cluster in KUBECONFIG is not reachable: {exc}"
    return True, ""


def test_a_plain_job_runs_on_a_live_cluster():
    ok, why = _cluster_reachable()
    if not ok:
        pytest.skip(why)

    sched = get_scheduler("kubernetes")
    handle = sched.submit(JobSpec(name="trainops-live-check", command=["python", "-c", "print('ok')"],
                                  image="python:3.11-slim"))
    try:
        assert sched.wait(handle.job_id, timeout_s=300).state == "completed"
        assert "ok" in sched.logs(handle.job_id)
    finally:
        sched.cancel(handle.job_id)


class _RecordingApiServer:
    """Answers the few API paths a cancel uses and records each request. A stand-in: no
    Kubernetes API server can run on this machine; the real `kubernetes` client talks to it."""
    def __init__(self):
        self.requests: list[tuple[str, str]] = []
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama-drill", "namespace": "training"},
               "spec": {"completions": 1, "template": {"spec": {"containers": []}}}, "status": {"active": 1}}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict) -> None:
                server.requests.append((self.command, self.path))
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                self._answer(job)

            def do_DELETE(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer({"apiVersion": "v1", "kind": "Status", "status": "Success"})

            def log_message(self, *_args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.mark.parametrize("force", [False, True])
def test_a_forced_cancel_deletes_the_pods_with_no_grace_period(tmp_path, monkeypatch, force):
    api = _RecordingApiServer()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{api.url}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    try:
        assert get_scheduler("kubernetes").cancel("training/llama-drill", force=force).state == "cancelled"
    finally:
        api.httpd.shutdown()
        api.httpd.server_close()
    deletes = {urlsplit(path).path: parse_qs(urlsplit(path).query) for method,
               path in api.requests if method == "DELETE"}
    job = deletes["/apis/batch/v1/namespaces/training/jobs/llama-drill"]
    assert job["propagationPolicy"] == ["Background" if force else "Foreground"]
    pods = deletes.get("/api/v1/namespaces/training/pods")
    if force:
        assert pods == {"labelSelector": ["trainops/job=llama-drill"], "gracePeriodSeconds": ["0"]}
    else:
        assert pods is None
