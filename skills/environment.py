"""S1: the environment declaration every MFU or scaling conclusion must carry."""
from __future__ import annotations

import time

from trainops.skills.evidence.model import EvidenceRow, PackEnvironment
from trainops.tools.calls import invoke, validating
from trainops.tools.context import CallContext
from trainops.tools.environment import probes
from trainops.tools.environment.env import EnvInput
from trainops.workspace import audit_log_path


def declare(scheduler: str = "local", ctx: CallContext | None = None,
            framework: str = "trainops") -> tuple[PackEnvironment, EvidenceRow]:
    """Declare through the `declare_environment` tool and keep the pack's short form of it;
    `framework` other than trainops declares that adapter's framework and its installed version."""
    started = time.time()
    with validating(probes.declare_environment):  # the scheduler and framework as the command line named them
        inp = EnvInput(scheduler=scheduler, ckpt_test_mib=16, framework=framework if framework != "trainops" else None)
    env = invoke(probes.declare_environment, inp, ctx)
    decl = PackEnvironment(
        framework=env.framework.name, framework_version=env.framework.version, torch_version=env.software.torch,
        hardware=f"{env.accelerators.model} ({env.hardware_generation})",
        device_count=env.accelerators.count, backend=env.software.distributed_backend,
        scheduler=f"{env.scheduler.kind} {env.scheduler.version}",
        checkpoint_write_gib_per_s=env.checkpoint_storage.write_bandwidth_mib_s / 1024,
        hot_spares=len(env.scheduler.hot_spare_nodes), accelerator_kind=env.accelerators.kind,
        scale_up_domain=env.accelerators.scale_up_domain.gpus if env.accelerators.scale_up_domain else None,
        inter_node_gbit_s=env.inter_node_all_reduce.bandwidth_gbit_s if env.inter_node_all_reduce else None)
    row = EvidenceRow(tool="declare_environment", version=env.framework.version,
                      command="trainops env --json" + (f" --framework {framework}" if framework != "trainops" else ""),
                      log_path=str(audit_log_path()),
                      value=f"{decl.hardware}; peak {env.compute_peak.peak_tflops:.3f} TFLOP/s "
                      f"({env.compute_peak.source})", window_start=started, window_end=time.time())
    return decl, row
