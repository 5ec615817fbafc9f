"""The catalog of trainops' tools, built explicitly: every tool of `trainops.tools` is listed here, once.

Adding a tool is one line in `_tool_functions`. Layers above add their own tools the same way:
`build_registry(extra=...)` takes more declared functions (the agent passes the SOP's step tools
and `list_pending_approvals`), so the CLI and the agent build the same registry whatever ran
before, and nothing registers itself on import. Calling a tool is not this module's concern
(`trainops.tools.calls`); which registry is served is `trainops.tools.context`'s.
"""
from __future__ import annotations

from functools import cache
from typing import Callable, Iterable

from trainops.tools.changes import quotas, scheduler_policy, tenancy
from trainops.tools.changes import records as changes
from trainops.tools.context import served
from trainops.tools.environment import probes as env_probes
from trainops.tools.frameworks import checks
from trainops.tools.governance import escalation
from trainops.tools.jobs import jobs, log_search, run_compare
from trainops.tools.planning import checkpoint_interval, effective_training_time, layout
from trainops.tools.registry import Registry, spec_of
from trainops.tools.reliability import checkpoints, detection, ettr, faults, interruptions, quarantine, watch


def _tool_functions() -> tuple[Callable, ...]:
    """Every tool trainops.tools declares."""
    return (
        env_probes.declare_environment,
        checkpoint_interval.plan_checkpoint_interval,
        effective_training_time.plan_effective_training_time,
        layout.plan_layout,
        jobs.submit_job,
        jobs.job_status,
        jobs.wait_job,
        jobs.job_logs,
        log_search.grep_log,
        log_search.read_log_window,
        jobs.cancel_job,
        jobs.requeue_job,
        jobs.list_jobs,
        jobs.list_nodes,
        jobs.drain_node,
        jobs.resume_node,
        jobs.query_metrics,
        jobs.summarize_run,
        run_compare.compare_runs,
        faults.inject_fault,
        detection.detect_faults,
        detection.find_straggler,
        checkpoints.list_checkpoints,
        checkpoints.verify_checkpoint,
        checkpoints.measure_checkpoint_io,
        quarantine.quarantine_checkpoints,
        quotas.set_tenant_quota,
        scheduler_policy.change_scheduler_policy,
        changes.rollback_change,
        tenancy.upgrade_framework,
        checks.framework_knobs,
        checks.check_framework_job,
        watch.watch_job,
        interruptions.list_interruptions,
        ettr.effective_training_time,
        escalation.acknowledge_escalation,
    )


def build_registry(extra: Iterable[Callable] = ()) -> Registry:
    """The registry of every trainops tool, plus `extra` declared tools from a layer above."""
    return Registry(spec_of(fn) for fn in (*_tool_functions(), *extra))


@cache
def tool_registry() -> Registry:
    """The tools of `trainops.tools` alone: what skills and `trainops.tools.calls.call` use."""
    return build_registry()


def current_registry() -> Registry:
    """The registry being served (by a registry's `call`, or the CLI), else `tool_registry()`."""
    registry = served()
    return registry if registry is not None else tool_registry()
