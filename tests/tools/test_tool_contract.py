"""The tool contract: one explicit registry, typed schemas, validation naming the field, every call
gated and recorded, and the same tools as LangChain structured tools."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.tools import StructuredTool
from pydantic import BaseModel

from trainops.agents.agent_tools import agent_registry
from trainops.tools.base import ToolError, tool
from trainops.tools.calls import call, invoke, validating
from trainops.tools.catalog import build_registry, tool_registry
from trainops.tools.context import CallContext
from trainops.tools.governance import escalation
from trainops.tools.governance.gate import GateRefused
from trainops.tools.langchain import as_langchain_tools
from trainops.tools.planning import checkpoint_interval


def registry():
    return tool_registry()


MINE = {
    "declare_environment", "plan_checkpoint_interval", "plan_effective_training_time", "plan_layout",
    "list_checkpoints", "verify_checkpoint", "measure_checkpoint_io",
}
DALY_24H = {"save_s": 300, "restart_s": 600, "mtbf_h": 24}


def audit_entries(workspace) -> list[dict]:
    path = workspace / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_registry_holds_the_environment_planning_and_checkpoint_tools():
    assert MINE <= set(registry())


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_tool_exports_input_and_output_schemas_and_a_description(name):
    spec = registry()[name]
    assert spec.risk in ("read", "mutate", "irreversible")
    assert len(spec.description) > 20
    assert issubclass(spec.Input, BaseModel) and issubclass(spec.Output, BaseModel)
    assert spec.Input.model_json_schema()["type"] == "object"
    assert spec.Output.model_json_schema()["type"] == "object"


def test_irreversible_tools_always_need_approval():
    assert all(s.approval_required for s in registry().values() if s.risk == "irreversible")


def test_bad_input_raises_a_tool_error_naming_the_tool_field_and_value():
    with pytest.raises(ToolError) as caught:
        call("plan_checkpoint_interval", DALY_24H | {"mtbf_h": "soon"})
    assert caught.value.tool == "plan_checkpoint_interval"
    assert "mtbf_h" in caught.value.message and "'soon'" in caught.value.message


def test_a_missing_field_says_to_add_it():
    with pytest.raises(ToolError, match="save_s: required field missing"):
        call("plan_checkpoint_interval", {"restart_s": 60, "mtbf_h": 24})


def test_an_unknown_tool_lists_the_known_ones():
    with pytest.raises(ToolError, match="unknown tool; known tools: .*plan_layout"):
        call("no_such_tool", {})


def test_the_gate_records_each_call_with_the_caller(workspace):
    call("plan_checkpoint_interval", DALY_24H, CallContext(actor="operator").for_skill("checkpoint-plan"))
    call("plan_checkpoint_interval", DALY_24H, CallContext(actor="operator").for_skill("checkpoint-plan"))
    calls = [e for e in audit_entries(workspace)
             if e.get("kind") == "tool_call" and e.get("tool") == "plan_checkpoint_interval"]
    assert len(calls) == 2 and all(e["ok"] and e["actor"] == "skill:checkpoint-plan for operator" for e in calls)


def test_the_gate_records_a_failed_call_as_not_ok(workspace):
    with pytest.raises(ToolError):
        call("list_checkpoints", {"run": "ghost"})
    failed = [e for e in audit_entries(workspace) if e.get("tool") == "list_checkpoints"]
    assert failed and failed[-1]["ok"] is False and "ghost" in failed[-1]["error"]


# --- typed calls ---------------------------------------------------------------------------------


def test_invoke_takes_the_tools_input_and_returns_its_output_typed(workspace):
    out = invoke(checkpoint_interval.plan_checkpoint_interval,
                 checkpoint_interval.CheckpointIntervalInput(save_s=300, restart_s=600, mtbf_h=24),
                 CallContext(actor="operator").for_skill("checkpoint-plan"))
    assert isinstance(out, checkpoint_interval.CheckpointIntervalOutput)
    assert out.daly_interval_min == pytest.approx(116.7, abs=0.1)
    entries = [e for e in audit_entries(workspace) if e.get("tool") == "plan_checkpoint_interval"]
    assert entries[-1]["ok"] and entries[-1]["actor"] == "skill:checkpoint-plan for operator"


def test_invoke_passes_the_gate_so_a_gated_tool_still_needs_a_human(workspace):
    esc = escalation.AcknowledgeEscalationInput(rule_id="R-ESC-3", action="fleet_and_colocated_sdc_tests",
                                                subject="run r1", detail="replica checksums disagree")
    with pytest.raises(GateRefused) as refused:
        invoke(escalation.acknowledge_escalation, esc, CallContext(actor="operator").for_skill("sdc-response"))
    assert refused.value.pending_id is not None


def test_invoke_refuses_a_function_that_is_not_a_declared_tool():
    with pytest.raises(TypeError, match="is not a tool"):
        invoke(len, PlainInput())  # type: ignore[arg-type]


def test_an_input_built_from_outside_values_is_refused_as_a_call_by_name_refuses_it():
    with pytest.raises(ToolError) as typed:
        with validating(checkpoint_interval.plan_checkpoint_interval):
            checkpoint_interval.CheckpointIntervalInput(save_s=300, restart_s=600, mtbf_h="soon")
    with pytest.raises(ToolError) as by_name:
        call("plan_checkpoint_interval", DALY_24H | {"mtbf_h": "soon"})
    assert str(typed.value) == str(by_name.value)


# --- LangChain ------------------------------------------------------------------------------


def test_every_tool_becomes_a_structured_tool_with_its_input_as_args_schema():
    lc_tools = as_langchain_tools()
    assert [t.name for t in lc_tools] == sorted(registry())
    for lc in lc_tools:
        assert isinstance(lc, StructuredTool) and lc.args_schema is registry()[lc.name].Input
        assert f"risk: {registry()[lc.name].risk}" in lc.description


def test_a_structured_tool_call_passes_the_gate_as_the_agent(workspace):
    (plan,) = as_langchain_tools(["plan_checkpoint_interval"])
    out = plan.invoke(DALY_24H)
    assert out["daly_interval_min"] == pytest.approx(116.7, abs=0.1)
    entries = [e for e in audit_entries(workspace) if e.get("tool") == "plan_checkpoint_interval"]
    assert entries[-1]["actor"] == "agent"


def test_the_context_factory_supplies_the_caller(workspace):
    (plan,) = as_langchain_tools(["plan_checkpoint_interval"],
                                 ctx_factory=lambda: CallContext(actor="agent", thread_id="t1"))
    plan.invoke(DALY_24H)
    assert (audit_entries(workspace)[-1]["actor"], audit_entries(workspace)[-1]["thread_id"]) == ("agent", "t1")


def test_invalid_agent_input_comes_back_as_a_message_naming_the_field():
    (plan,) = as_langchain_tools(["plan_checkpoint_interval"])
    answer = plan.invoke(DALY_24H | {"save_s": -1})
    assert isinstance(answer, str) and "save_s" in answer and "-1" in answer


def test_a_tool_error_comes_back_to_the_agent_as_text():
    (lister,) = as_langchain_tools(["list_checkpoints"])
    answer = lister.invoke({"run": "ghost"})
    assert isinstance(answer, str) and "run 'ghost' not found" in answer


def test_asking_for_an_unknown_tool_is_an_error():
    with pytest.raises(ToolError, match="unknown tool"):
        as_langchain_tools(["nope"])


def test_structured_tools_that_change_the_world_say_they_need_a_human():
    labels = {t.name: t.description.split("]")[0] for t in as_langchain_tools()}
    assert labels["cancel_job"] == "[risk: mutate, needs human approval"
    assert labels["plan_layout"] == "[risk: read"


# --- the explicit registry ---------------------------------------------------------------------------


def test_the_registry_is_the_same_whatever_was_imported_before():
    before = set(tool_registry())

    assert set(build_registry()) == set(tool_registry()) == before
    assert not {"sop_declare", "list_pending_approvals"} & before


def test_the_agent_registry_is_every_tool_plus_the_agents_own():
    assert set(agent_registry()) == set(tool_registry()) | {"respond_to_sdc", "sdc_case",
                                                                  "ablation_design", "list_pending_approvals",
                                                                  "load_skill", "sop_declare", "sop_baseline",
                                                                  "sop_design", "sop_arm", "sop_drill", "sop_pack",
                                                                  "sop_steer"}


def test_a_fresh_process_lists_the_same_tools_as_the_agent_registry():
    done = subprocess.run([str(Path(sys.executable).parent / "trainops"), "tool", "list", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert [r["name"] for r in json.loads(done.stdout)] == list(agent_registry())


def test_declaring_a_tool_registers_nothing():
    @tool("declared_only", risk="read")
    def declared_only(inp: PlainInput) -> PlainInput:
        """A tool declared in a test and listed nowhere."""
        return inp

    assert declared_only.tool_spec.name == "declared_only" and "declared_only" not in tool_registry()
    assert call("declared_only", {"x": 1}, registry=build_registry(extra=[declared_only])).x == 1


def test_two_tools_with_one_name_are_refused_when_the_registry_is_built():
    @tool("plan_layout", risk="read")
    def impostor(inp: PlainInput) -> PlainInput:
        """A second tool claiming an existing name."""
        return inp

    with pytest.raises(ValueError, match="tool plan_layout is declared twice"):
        build_registry(extra=[impostor])


def test_a_function_that_is_not_a_declared_tool_is_refused_by_the_registry():
    with pytest.raises(TypeError, match="is not a tool: declare it with @tool"):
        build_registry(extra=[len])


class PlainInput(BaseModel):
    x: int = 0


# --- calls by name stay at the boundary --------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("agents", "benchmarks", "skills", "tools", "trainer", "trainops")
BY_NAME = {"call", "get"}  # trainops.tools.calls' lookups by name
BOUNDARY = {
    "trainops/commands/tools.py",  # `trainops tool call NAME`: the name comes from the command line
    "agents/graph.py",  # a model's tool calls
    "agents/diagnose.py", "agents/policy.py",  # build a model's calls by name
    "benchmarks/agent_eval/",  # scenario replay
}
"""Where a tool's name arrives from outside; everywhere else product code calls its tools typed
(`trainops.tools.calls.invoke`), so a renamed tool or field fails where it is written."""


def calls_by_literal_name(source: str) -> list[str]:
    """`call("name", ...)` / `calls.get("name")` of trainops.tools.calls with a string literal for
    the name, as `line: code`, however the module imported it."""
    tree = ast.parse(source)
    direct, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "trainops.tools.calls":
            direct |= {alias.asname or alias.name for alias in node.names if alias.name in BY_NAME}
        elif isinstance(node, ast.ImportFrom) and node.module == "trainops.tools":
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "calls"}
        elif isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "trainops.tools.calls"}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            continue
        func = node.func
        by_name = (isinstance(func, ast.Name) and func.id in direct) or (
            isinstance(func, ast.Attribute) and func.attr in BY_NAME and ast.unparse(func.value) in modules)
        if by_name:
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)[:80]}"))
    return [hit for _line, hit in sorted(found)]


def test_the_finder_sees_a_call_by_name_however_calls_was_imported():
    assert calls_by_literal_name('from trainops.tools.calls import call as c\nc("job_status", {})')
    assert calls_by_literal_name('from trainops.tools import calls\ncalls.call("job_status", {})')
    assert calls_by_literal_name('import trainops.tools.calls\ntrainops.tools.calls.get("job_status")')
    assert not calls_by_literal_name('from trainops.tools.calls import call\ncall(name, {})')
    assert not calls_by_literal_name('def call(name): ...\ncall("job_status")')


def test_the_boundary_allow_list_names_modules_that_exist():
    assert all((REPO / entry).exists() for entry in BOUNDARY)


def test_product_code_calls_its_own_tools_typed_not_by_name():
    offenders = []
    for folder in PRODUCT:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if any(relative == entry or (entry.endswith("/") and relative.startswith(entry)) for entry in BOUNDARY):
                continue
            offenders += [f"{relative}:{hit}" for hit in calls_by_literal_name(path.read_text(encoding="utf-8"))]
    assert not offenders, ("call a tool with invoke(module.tool_fn, ToolInput(...), ctx), not by name outside the "
                           "boundary:\n" + "\n".join(offenders))
