"""The tool registry, built explicitly: every tool of `trainops.tools` is listed here, once.

Adding a tool is one line in `_tool_functions`. Layers above add their own tools the same way:
`build_registry(extra=...)` takes more declared functions (the agent passes `run_sop` and
`list_pending_approvals`), so the CLI and the agent build the same registry whatever ran
before, and nothing registers itself on import. `trainops.tools.calls.call(..., registry=R)` serves R
for the call's duration (`current_registry`), so governance looks a tool up in the registry that
called it; the CLI serves the full registry for each command, so `trainops approve` knows the
agent's tools. Calling a tool is not this module's concern (`trainops.tools.calls`).
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Callable, Iterable, Iterator

from trainops.tools.base import ToolError, ToolSpec


def _tool_functions() -> tuple[Callable, ...]:
    """Every tool trainops.tools declares. Modules load here, on first use, not at import."""
    from trainops.tools.changes import quotas, scheduler_policy, tenancy
    from trainops.tools.changes import records as changes
    from trainops.tools.environment import probes as env_probes
    from trainops.tools.frameworks import checks
    from trainops.tools.governance import escalation
    from trainops.tools.jobs import jobs, log_search, run_compare
    from trainops.tools.planning import planning
    from trainops.tools.reliability import checkpoints, detection, faults, interruptions, quarantine, watch

    return (
        env_probes.declare_environment,
        planning.plan_checkpoint_interval,
        planning.plan_effective_training_time,
        planning.plan_layout,
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
        interruptions.effective_training_time,
        escalation.acknowledge_escalation,
    )


def spec_of(fn: Callable) -> ToolSpec:
    spec = getattr(fn, "tool_spec", None)
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} is not a tool: declare it with @tool(name, risk=...)")
    return spec


class Registry(Mapping[str, ToolSpec]):
    """Tools by name, sorted."""

    def __init__(self, specs: Iterable[ToolSpec]):
        by_name: dict[str, ToolSpec] = {}
        for spec in specs:
            if spec.name in by_name and by_name[spec.name] is not spec:
                raise ValueError(f"tool {spec.name} is declared twice: give one of them another name")
            by_name[spec.name] = spec
        self._specs = dict(sorted(by_name.items()))

    def __getitem__(self, name: str) -> ToolSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def spec(self, name: str) -> ToolSpec:
        """The tool called `name`; an unknown name is a ToolError listing the known ones."""
        if name not in self._specs:
            raise ToolError(name, f"unknown tool; known tools: {', '.join(self._specs)}")
        return self._specs[name]


def build_registry(extra: Iterable[Callable] = ()) -> Registry:
    """The registry of every trainops tool, plus `extra` declared tools from a layer above."""
    return Registry(spec_of(fn) for fn in (*_tool_functions(), *extra))


@cache
def tool_registry() -> Registry:
    """The tools of `trainops.tools` alone: what skills and `trainops.tools.calls.call` use."""
    return build_registry()


_SERVING: ContextVar[Callable[[], Registry] | None] = ContextVar("trainops_serving_registry", default=None)


@contextmanager
def serving(source: Callable[[], Registry]) -> Iterator[None]:
    """Make `source()` (built only when first needed) the registry tools are looked up in."""
    reset = _SERVING.set(cache(source))
    try:
        yield
    finally:
        _SERVING.reset(reset)


def current_registry() -> Registry:
    """The registry being served (by a registry's `call`, or the CLI), else `tool_registry()`."""
    source = _SERVING.get()
    return source() if source is not None else tool_registry()
