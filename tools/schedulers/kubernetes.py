"""Kubernetes: an indexed `batch/v1` Job (one pod per node, torchrun inside) plus a headless
Service that gives pod 0 a stable DNS name for the c10d rendezvous
(`<name>-0.<name>.<namespace>.svc`). Talks to the API server through the `kubernetes`
client (imported on first use); `KUBECONFIG` or the in-cluster config selects the cluster.
Job ids are `<namespace>/<name>`; `partition` in the JobSpec is the namespace."""
from __future__ import annotations

import os
import time
from typing import Any

from trainops.tools.schedulers.base import (
    TERMINAL_STATES,
    JobHandle,
    JobSpec,
    JobStatus,
    NodeInfo,
    PollingWait,
    SchedulerError,
)
from trainops.tools.schedulers.job_env import check_spec_env
from trainops.trainer.launch import torchrun_argv

KIND = "kubernetes"
MANAGED_BY = {"app.kubernetes.io/managed-by": "trainops"}


def _labels(spec: JobSpec) -> dict[str, str]:
    return {**MANAGED_BY, "trainops/job": spec.name}


def service_manifest(spec: JobSpec) -> dict[str, Any]:
    """Headless Service: DNS records for the Job's pods, so node 0 hosts the rendezvous."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": spec.name, "namespace": spec.partition or "default", "labels": _labels(spec)},
        "spec": {"clusterIP": "None", "selector": _labels(spec), "publishNotReadyAddresses": True,
                 "ports": [{"name": "rdzv", "port": spec.rdzv_port, "targetPort": spec.rdzv_port}]},
    }


def job_manifest(spec: JobSpec) -> dict[str, Any]:
    """Indexed Job: `nodes` pods, each running torchrun with `procs_per_node` ranks."""
    if not spec.image:
        raise SchedulerError(KIND,
                             "JobSpec.image is empty: Kubernetes needs a container image with the trainer installed "
                             "(e.g. image='registry/trainops:0.1')")
    namespace = spec.partition or "default"
    if spec.launcher == "torchrun":
        command = torchrun_argv("python", spec.procs_per_node, spec.command, nnodes=spec.nodes,
                                rdzv_endpoint=f"{spec.name}-0.{spec.name}.{namespace}.svc:{spec.rdzv_port}",
                                rdzv_id=spec.name, runs_here=False)
    else:
        command = list(spec.command)
    # the pod's environment is the image's and the spec's only; never a secret-shaped name (job_env.py)
    env = [{"name": k, "value": v} for k, v in sorted(check_spec_env(spec, KIND).items())]
    env.append({"name": "NODE_RANK",
                "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
    container: dict[str, Any] = {
        "name": "trainer", "image": spec.image, "command": command, "env": env,
        "ports": [{"containerPort": spec.rdzv_port, "name": "rdzv"}],
        "resources": {"requests": {"cpu": str(spec.procs_per_node)}},
    }
    if spec.workdir:
        container["workingDir"] = spec.workdir
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "subdomain": spec.name, "containers": [container]}
    if spec.exclude_nodes:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                       "values": list(spec.exclude_nodes)}]}]}}}
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes, "backoffLimit": 0,
        "template": {"metadata": {"labels": _labels(spec)}, "spec": pod_spec},
    }
    if spec.time_limit_min:
        job_spec["activeDeadlineSeconds"] = spec.time_limit_min * 60
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": spec.name, "namespace": namespace, "labels": _labels(spec)}, "spec": job_spec}


def _split(job_id: str) -> tuple[str, str]:
    namespace, sep, name = job_id.partition("/")
    if not sep or not namespace or not name:
        raise SchedulerError(KIND, f"job id {job_id!r} is not '<namespace>/<name>' (as submit returned it)")
    return namespace, name


class KubernetesScheduler(PollingWait):
    kind = KIND
    poll_s = 1.0

    def __init__(self) -> None:
        self._api = None

    def _clients(self):
        if self._api is None:
            from kubernetes import client, config

            try:
                # read KUBECONFIG now: the client library reads it once, when it is imported
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
            except Exception as kube_exc:
                try:
                    config.load_incluster_config()
                except Exception:
                    raise SchedulerError(KIND,
                                         f"no cluster configured ({kube_exc}); set KUBECONFIG to a kubeconfig for a "
                                         "reachable cluster") from None
            self._api = (client.BatchV1Api(), client.CoreV1Api())
        return self._api

    def _call(self, what: str, fn, *args, **kw):
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kw)
        except ApiException as exc:
            if exc.status == 404:
                raise SchedulerError(KIND,
                                     f"{what}: not found on the API server; check the job id / node name") from None
            raise SchedulerError(KIND,
                                 f"{what} failed: HTTP {exc.status} {exc.reason}; check permissions and the API server "
                                 "in KUBECONFIG") from None
        except Exception as exc:
            host = self._clients()[0].api_client.configuration.host
            raise SchedulerError(KIND,
                                 f"{what} failed talking to {host}: {type(exc).__name__}: {str(exc)[:200]}; check that "
                                 "the API server is reachable") from None

    def submit(self, spec: JobSpec) -> JobHandle:
        batch, core = self._clients()
        job = job_manifest(spec)
        namespace = job["metadata"]["namespace"]
        if spec.launcher == "torchrun":
            self._call(f"create Service {namespace}/{spec.name}", core.create_namespaced_service, namespace,
                       service_manifest(spec))
        self._call(f"create Job {namespace}/{spec.name}", batch.create_namespaced_job, namespace, job)
        return JobHandle(job_id=f"{namespace}/{spec.name}", backend=KIND, name=spec.name, submitted_at=time.time(),
                         run_dir=spec.run_dir)

    def status(self, job_id: str) -> JobStatus:
        namespace, name = _split(job_id)
        batch, _ = self._clients()
        job = self._call(f"read Job {job_id}", batch.read_namespaced_job_status, name, namespace)
        st, completions = job.status, job.spec.completions or 1
        if (st.succeeded or 0) >= completions:
            state = "completed"
        elif st.failed:
            state = "failed"
        elif st.active:
            state = "running"
        else:
            state = "pending"
        reason = "; ".join(f"{c.type}: {c.reason or ''} {c.message or ''}".strip() for c in (st.conditions or []))
        created = job.metadata.creation_timestamp if job.metadata else None
        return JobStatus(job_id=job_id, backend=KIND, name=name, state=state, reason=reason,
                         submitted_at=created.timestamp() if created else None,
                         started_at=st.start_time.timestamp() if st.start_time else None,
                         ended_at=st.completion_time.timestamp() if st.completion_time else None)

    def _pods(self, namespace: str, name: str):
        _, core = self._clients()
        return self._call(f"list pods of {namespace}/{name}", core.list_namespaced_pod, namespace,
                          label_selector=f"trainops/job={name}").items

    def logs(self, job_id: str, tail: int = 100, rank: int | None = None) -> str:
        """The job's pods' logs; `rank` picks the pod of that node index."""
        namespace, name = _split(job_id)
        _, core = self._clients()
        parts = []
        for pod in sorted(self._pods(namespace, name), key=lambda p: p.metadata.name):
            index = (pod.metadata.annotations or {}).get("batch.kubernetes.io/job-completion-index")
            if rank is not None and index != str(rank):
                continue
            text = self._call(f"read log of pod {pod.metadata.name}", core.read_namespaced_pod_log, pod.metadata.name,
                              namespace,
                              tail_lines=tail or None)
            parts.append(f"== {pod.metadata.name} ==\n{text}")
        return "\n".join(parts)

    def cancel(self, job_id: str, force: bool = False) -> JobStatus:
        """Delete the Job and its pods. `force` deletes the pods with grace 0 (SIGKILL now) instead
        of their terminationGracePeriodSeconds, which the garbage collector would honour."""
        namespace, name = _split(job_id)
        batch, core = self._clients()
        before = self.status(job_id)
        self._call(f"delete Job {job_id}", batch.delete_namespaced_job, name, namespace,
                   propagation_policy="Background" if force else "Foreground")
        if force:
            self._call(f"delete pods of {job_id}", core.delete_collection_namespaced_pod, namespace,
                       label_selector=f"trainops/job={name}", grace_period_seconds=0)
        try:
            core.delete_namespaced_service(name, namespace)
        except Exception:
            pass
        return before.model_copy(update={"state": "cancelled" if before.state not in TERMINAL_STATES else before.state})

    def requeue(self, job_id: str) -> JobHandle:
        raise SchedulerError(KIND,
                             f"requeue of {job_id}: a Kubernetes Job cannot be restarted in place; cancel it and "
                             "submit the same JobSpec again (the trainer resumes from its checkpoint)")

    def list_jobs(self) -> list[JobStatus]:
        batch, _ = self._clients()
        jobs = self._call("list Jobs", batch.list_job_for_all_namespaces,
                          label_selector="app.kubernetes.io/managed-by=trainops").items
        return [self.status(f"{j.metadata.namespace}/{j.metadata.name}") for j in jobs]

    def list_nodes(self) -> list[NodeInfo]:
        _, core = self._clients()
        out = []
        for node in self._call("list nodes", core.list_node).items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
            state = "drained" if node.spec.unschedulable else ("idle" if ready else "down")
            cpus = node.status.capacity.get("cpu") if node.status.capacity else None
            out.append(NodeInfo(name=node.metadata.name, state=state,
                                cpus=int(cpus) if cpus and cpus.isdigit() else None,
                                reason=(node.metadata.annotations or {}).get("trainops/drain-reason", "")))
        return out

    def _set_schedulable(self, node: str, unschedulable: bool, reason: str) -> NodeInfo:
        _, core = self._clients()
        body = {"spec": {"unschedulable": unschedulable},
                "metadata": {"annotations": {"trainops/drain-reason": reason if unschedulable else None}}}
        self._call(f"patch node {node}", core.patch_node, node, body)
        return next(n for n in self.list_nodes() if n.name == node)

    def drain(self, node: str, reason: str) -> NodeInfo:
        """Cordon the node (no new pods); running pods finish or are cancelled by the drill."""
        return self._set_schedulable(node, True, reason or "drained by trainops")

    def resume(self, node: str) -> NodeInfo:
        return self._set_schedulable(node, False, "")
