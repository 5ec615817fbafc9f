"""`trainops tool ...`, `trainops env`, `trainops plan ...` through typer's CliRunner."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trainops.cli import COMMANDS, app, load_command
from trainops.commands.tools import app as tools_app
from trainops.tools.calls import call

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_tool_list_json_gives_name_risk_approval_and_description():
    result = invoke("tool", "list", "--json")
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["plan_checkpoint_interval"]["risk"] == "read"
    assert rows["plan_checkpoint_interval"]["approval_required"] is False
    assert rows["declare_environment"]["description"].startswith("Declare the training environment")


def test_a_fresh_cli_lists_the_agents_own_tools_too():
    """In a new process (in this one an agent test may have registered them already)."""
    done = subprocess.run([str(Path(sys.executable).parent / "trainops"), "tool", "list", "--json"],
                          capture_output=True, text=True, timeout=60)
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["sop_declare"]["risk"] == "mutate" and rows["list_pending_approvals"]["risk"] == "read"


def test_tool_list_renders_a_table_for_people():
    result = invoke("tool", "list")
    assert result.exit_code == 0 and "plan_layout" in result.stdout and "risk" in result.stdout


def test_tool_schema_prints_input_and_output_json_schemas():
    result = invoke("tool", "schema", "plan_checkpoint_interval")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert set(schema["input"]["required"]) == {"save_s", "mtbf_h"}  # restart_s may come from a drill (restart_from)
    assert "daly_interval_min" in schema["output"]["properties"]


def test_tool_schema_of_an_unknown_tool_fails_with_exit_2():
    result = invoke("tool", "schema", "nope")
    assert result.exit_code == 2 and "unknown tool" in result.output


def test_tool_call_runs_the_tool_and_prints_json():
    result = invoke("tool", "call", "plan_checkpoint_interval", "--input", '{"save_s":300,"restart_s":600,"mtbf_h":6}',
                    "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["daly_interval_min"] == pytest.approx(57, abs=1)


def test_tool_call_with_bad_json_is_one_line_and_exit_2():
    result = invoke("tool", "call", "plan_checkpoint_interval", "--input", "{save_s: 3", "--json")
    assert result.exit_code == 2
    assert "--input is not valid JSON" in json.loads(result.stdout)["error"]
    assert "Traceback" not in result.output


def test_tool_call_with_a_json_list_says_an_object_is_needed():
    result = invoke("tool", "call", "plan_checkpoint_interval", "--input", "[1]")
    assert result.exit_code == 2 and "must be a JSON object" in result.output


def test_tool_call_with_an_invalid_field_names_it_and_exits_2():
    result = invoke("tool", "call", "plan_checkpoint_interval", "--input", '{"save_s":-5,"restart_s":600,"mtbf_h":6}',
                    "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert "save_s" in error and "-5" in error and "Traceback" not in result.output


def test_plan_checkpoint_reproduces_dalys_24h_example():
    result = invoke("plan", "checkpoint", "--save-s", "300", "--restart-s", "600", "--mtbf-h", "24", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["daly_interval_min"] == pytest.approx(117, abs=1)


def test_plan_checkpoint_renders_the_recommendation_for_people():
    result = invoke("plan", "checkpoint", "--save-s", "300", "--restart-s", "600", "--mtbf-h", "0.25")
    assert result.exit_code == 0 and "two-phase" in result.stdout


def test_plan_ettr_defaults_to_the_llama3_profile_and_is_reproducible():
    first = invoke("plan", "ettr", "--json", "--seed", "3")
    second = invoke("plan", "ettr", "--json", "--seed", "3")
    assert first.exit_code == 0 and first.stdout == second.stdout
    out = json.loads(first.stdout)
    assert out["profile"].startswith("Llama 3") and 0 < out["ettr"] < 1


def test_plan_ettr_options_left_out_take_the_tools_defaults():
    result = invoke("plan", "ettr", "--json", "--seed", "3")
    assert json.loads(result.stdout) == call("plan_effective_training_time", {"seed": 3}).model_dump(mode="json")


def test_env_measures_the_interconnect_only_on_a_scheduler_with_nodes():
    result = invoke("env", "--measure-interconnect", "--json")
    assert result.exit_code == 2 and "measure_interconnect=true needs scheduler='slurm'" in result.stdout


def test_plan_ettr_accepts_a_custom_profile_as_json():
    profile = {"name": "lab", "interruptions": 10, "reference_days": 10, "reference_gpus": 64,
               "cause_counts": {"gpu": 10}}
    result = invoke("plan", "ettr", "--gpus", "64", "--days", "30", "--profile", json.dumps(profile), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["profile"] == "lab"


def test_plan_ettr_with_an_unknown_mode_names_the_field():
    result = invoke("plan", "ettr", "--checkpoint-mode", "sometimes", "--json")
    assert result.exit_code == 2 and "checkpoint_mode" in json.loads(result.stdout)["error"]


def test_plan_layout_of_a_valid_preset_layout_lists_every_rank():
    result = invoke("plan", "layout", "--preset", "tiny", "--nproc", "4", "--set", "parallel.tp=2", "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["valid"] is True and len(out["plan"]["ranks"]) == 4


def test_plan_layout_of_an_impossible_layout_says_why_and_exits_1():
    result = invoke("plan", "layout", "--preset", "tiny", "--nproc", "3", "--set", "parallel.tp=2", "--json")
    assert result.exit_code == 1
    assert "not divisible" in json.loads(result.stdout)["error"]


def test_plan_layout_with_a_bad_override_names_it():
    result = invoke("plan", "layout", "--preset", "tiny", "--nproc", "2", "--set", "parallel.tp=two", "--json")
    assert result.exit_code == 2 and "parallel.tp" in json.loads(result.stdout)["error"]


def test_env_json_is_a_full_declaration(workspace):
    workspace.mkdir(parents=True, exist_ok=True)
    result = invoke("env", "--json", "--ckpt-test-mib", "2", "--ckpt-dir", str(workspace))
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["checkpoint_storage"]["write_bandwidth_mib_s"] > 0
    assert {"accelerators", "hardware_generation", "interconnect", "software", "framework", "scheduler",
            "compute_peak", "declared_at"} <= set(out)


def test_env_renders_a_table_for_people(workspace):
    workspace.mkdir(parents=True, exist_ok=True)
    result = invoke("env", "--ckpt-test-mib", "2", "--ckpt-dir", str(workspace))
    assert result.exit_code == 0 and "checkpoint write" in result.stdout and "MiB/s" in result.stdout


def test_env_with_an_unknown_scheduler_names_the_field_and_choices():
    result = invoke("env", "--scheduler", "pbs", "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert "scheduler" in error and "'pbs'" in error and "slurm" in error


def test_plan_ettr_takes_per_cause_detection_latency():
    result = invoke("plan", "ettr", "--detect", "gpu_sdc=3600", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["lost_h_by_cause"]["gpu_sdc"] > 5


def test_plan_ettr_with_a_malformed_detect_option_shows_the_form():
    result = invoke("plan", "ettr", "--detect", "gpu_sdc", "--json")
    assert result.exit_code == 2 and "CAUSE=SECONDS" in json.loads(result.stdout)["error"]


def test_plan_ettr_with_a_non_numeric_detect_value_names_the_field():
    result = invoke("plan", "ettr", "--detect", "gpu_sdc=soon", "--json")
    assert result.exit_code == 2 and "detection_latency_s_by_cause.gpu_sdc" in json.loads(result.stdout)["error"]


def test_plan_layout_of_a_missing_config_file_says_so():
    result = invoke("plan", "layout", "/no/such/job.toml", "--nproc", "2", "--json")
    assert result.exit_code == 2 and "does not exist" in json.loads(result.stdout)["error"]


def test_loading_the_root_cli_imports_no_heavy_module_and_no_command():
    """`trainops --help` starts fast: torch, LangGraph, LangChain, the run folder's models, the tool
    catalog and every command module load only when a command runs (the lazy group in cli.py)."""
    heavy = ("torch", "langgraph", "langchain_core", "matplotlib", "trainops.run_folder", "trainops.run_records",
             "trainops.tools.catalog")
    code = ("import sys, trainops.cli; print(sorted(m for m in sys.modules "
            f"if m in {heavy!r} or m.startswith('trainops.commands.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loading_any_command_module_does_not_import_torch_langchain_or_matplotlib():
    """Each command imports its own area at the top; the heavy libraries stay inside the commands."""
    areas = sorted({entry.area for entry in COMMANDS})
    code = (f"import importlib, sys; [importlib.import_module('trainops.commands.' + a) for a in {areas!r}]; "
            "print(sorted(m for m in ('torch', 'langgraph', 'langchain_core', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_command_table_lists_each_command_with_its_own_help():
    """`trainops --help` shows COMMANDS' summaries without loading a command: each must be the first
    paragraph of that command's own help, and every command of every area is listed once."""
    for entry in COMMANDS:
        command = load_command(entry)
        assert " ".join((command.help or "").split("\n\n")[0].split()) == entry.summary, entry.name
    listed = {(entry.area, entry.name) for entry in COMMANDS if not entry.group}
    for area in {entry.area for entry in COMMANDS if not entry.group}:
        group = typer.main.get_group(importlib.import_module(f"trainops.commands.{area}").app)
        assert {(area, name) for name in group.commands} <= listed, area


def test_an_unknown_command_is_refused_with_the_nearest_name():
    result = invoke("rulez")
    assert result.exit_code == 2 and "Did you mean 'rules'?" in result.output


QUOTA = '{"tenant": "lab", "gpus": 8, "priority": "high", "reason": "launch week"}'


def test_tool_call_of_a_gated_tool_without_a_token_is_refused_with_exit_2():
    result = invoke("tool", "call", "set_tenant_quota", "--input", QUOTA, "--json")
    assert result.exit_code == 2 and "missing_token" in json.loads(result.stdout)["error"]


def test_tool_call_passes_the_approval_token_to_the_gate():
    result = invoke("tool", "call", "set_tenant_quota", "--input", QUOTA, "--approval-token", "not-a-token", "--json")
    error = json.loads(result.stdout)["error"]
    assert result.exit_code == 2 and "refused" in error and "missing_token" not in error


def test_each_command_group_is_a_module_level_app_that_runs_alone():
    """Issue 15: a command group can be imported and invoked without the root CLI's wiring."""
    for area in ("train", "tools", "sop", "governance", "agent", "bench", "sandbox"):
        module = importlib.import_module(f"trainops.commands.{area}")
        assert isinstance(module.app, typer.Typer), area
        assert not hasattr(module, "register"), f"trainops.commands.{area} still wires itself through register()"

    result = CliRunner().invoke(tools_app, ["plan", "checkpoint", "--save-s", "60", "--restart-s", "300",
                                            "--mtbf-h", "10", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["daly_interval_min"] > 0
