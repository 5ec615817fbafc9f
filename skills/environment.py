"""S1: the environment declaration every MFU or scaling conclusion must carry. On a cluster it also
declares where the job runs: its partition and nodes, the measured bandwidth between nodes, the hot
spares the scheduler really has (idle nodes of that partition beyond the job's own) and the shadow
partition changes are tried in first; and the monitor, checked to answer."""
from __future__ import annotations

import time

from trainops.skills.evidence.model import EvidenceRow, PackEnvironment
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.context import CallContext
from trainops.tools.environment import probes
from trainops.tools.environment.env import EnvInput, EnvironmentDeclaration
from trainops.tools.monitoring import MonitorError, get_monitor
from trainops.workspace import audit_log_path


def declare(scheduler: str = "local", ctx: CallContext | None = None, framework: str = "trainops",
            partition: str | None = None, job_nodes: int = 1,
            monitor: str = "embedded") -> tuple[PackEnvironment, EvidenceRow]:
    """Declare through the `declare_environment` tool and keep the pack's short form of it;
    `framework` other than trainops declares that adapter's framework and its installed version. A job
    on more than one node measures the all-reduce between nodes of its partition first."""
    started = time.time()
    with validating(probes.declare_environment):  # the scheduler and framework as the command line named them
        inp = EnvInput(scheduler=scheduler, ckpt_test_mib=16, framework=framework if framework != "trainops" else None,
                       partition=partition, measure_interconnect=job_nodes > 1)
    env = invoke(probes.declare_environment, inp, ctx)
    measured = env.inter_node_all_reduce
    decl = PackEnvironment(
        framework=env.framework.name, framework_version=env.framework.version, torch_version=env.software.torch,
        hardware=f"{env.accelerators.model} ({env.hardware_generation})",
        device_count=env.accelerators.count, backend=env.software.distributed_backend,
        scheduler=f"{env.scheduler.kind} {env.scheduler.version}",
        checkpoint_write_gib_per_s=env.checkpoint_storage.write_bandwidth_mib_s / 1024,
        accelerator_kind=env.accelerators.kind,
        scale_up_domain=env.accelerators.scale_up_domain.gpus if env.accelerators.scale_up_domain else None,
        inter_node_gbit_s=measured.bandwidth_gbit_s if measured else None,
        inter_node_latency_us=measured.latency_us if measured else None,
        inter_node_measured_on=measured.nodes if measured else [],
        monitor=monitor, **placement(env, partition, job_nodes))
    row = EvidenceRow(tool="declare_environment", version=env.framework.version,
                      command="trainops env --json" + (f" --framework {framework}" if framework != "trainops" else "")
                      + (" --measure-interconnect" if measured else ""),
                      log_path=str(audit_log_path()),
                      value=f"{decl.hardware}; peak {env.compute_peak.peak_tflops:.3f} TFLOP/s "
                      f"({env.compute_peak.source})", window_start=started, window_end=time.time())
    return decl, row


def placement(env: EnvironmentDeclaration, partition: str | None, job_nodes: int) -> dict:
    """The job's partition, its nodes and CPUs, the hot spares and the shadow partition, as the scheduler
    reported them. The spares are the partition's idle nodes beyond the `job_nodes` the job takes (the
    first idle ones in the scheduler's order, as Slurm fills them): a node the job itself holds cannot
    replace it, and the local scheduler's one host is never its own spare."""
    sched = env.scheduler
    name = probes.partition_of(sched, partition)
    nodes = sched.partition_nodes.get(name, []) if name else sched.nodes
    if name and len(nodes) < job_nodes:
        raise ToolError("declare_environment", f"nodes={job_nodes}: partition {name!r} has {len(nodes)} node(s) "
                                               f"({', '.join(nodes) or 'none'}), so the job can never start; ask for "
                                               f"at most {len(nodes)} or name a larger partition (`sinfo` lists them)")
    idle = [n for n in sched.hot_spare_nodes if n in nodes]
    spares = idle[job_nodes:]
    cpus = [sched.cpus_per_node[n] for n in nodes if n in sched.cpus_per_node]
    return {"partition": name, "partition_nodes": nodes, "partition_cpus": sum(cpus) if cpus else None,
            "job_nodes": job_nodes, "hot_spare_nodes": spares, "hot_spares": len(spares),
            "shadow_partition": sched.shadow_partition or "none"}


def check_monitor(monitor: str) -> str:
    """The monitor as S1 declares it; a Prometheus must answer a query first (ValueError naming the fix).
    S2's step figures still come from each run's metrics.jsonl: Prometheus is checked, not yet read."""
    if monitor != "prometheus":
        return monitor
    try:
        prom = get_monitor("prometheus")
        targets = prom.query("up")
    except MonitorError as exc:
        raise ValueError(f"monitor=prometheus: {exc}. Start one (`trainops sandbox up --prometheus-port PORT` "
                         "starts the sandbox's) and name it in $TRAINOPS_PROMETHEUS_URL or [monitoring] "
                         "prometheus_urls, or use monitor=embedded") from None
    return f"prometheus at {getattr(prom, 'url', 'the injected monitor')} (answered: {len(targets)} scrape target(s))"
