"""A run's life from the command line: `trainops train` launches through the governance gate,
`--init-from` starts from a Hugging Face checkpoint (each rank loading its shard), `trainops
export` hands a checkpoint back, and `--resume` continues a run killed with kill -9."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from tests.conftest import wait_for
from tests.trainer.hf_import import import_hf
from trainops.cli import app
from trainops.run_records import read_metrics
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.jobs.trainer_job import trainer_job
from trainops.trainer.checkpoint_files import list_checkpoints
from trainops.trainer.config import load_config
from trainops.trainer.data import DataLoader
from trainops.trainer.launch import prepare_run

runner = CliRunner()
SHORT = ["--set", "data.kind=synthetic", "--set", "training.seq_len=32", "--set", "training.global_batch=8",
         "--set", "training.micro_batch=4"]


def _cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})


def _hf_folder(path: Path, tied: bool = True) -> Path:
    """A tiny Llama saved by transformers itself (vocab 256 so the byte data fits), by default with
    tied embeddings like Llama 3.2 1B/3B (the case whose tie must survive materializing under FSDP2)."""
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=256, max_position_embeddings=64, tie_word_embeddings=tied,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def _rank0_records(run_dir: str | Path) -> list:
    return [r for r in read_metrics(run_dir) if r.rank == 0]


def test_resume_refuses_an_override_that_would_change_the_model_by_name(workspace):
    prepare_run(None, "tiny", ["checkpoint.enable=true"], run_id="kept")
    result = _cli("train", "--resume", "kept", "--set", "model.n_layers=8", "--json")
    assert result.exit_code == 2
    assert "--set model.n_layers=8 would change model.n_layers of run kept" in json.loads(result.output)["error"]


def test_resume_of_a_run_without_a_verified_checkpoint_says_so(workspace):
    prepare_run(None, "tiny", ["checkpoint.enable=true"], run_id="empty")
    result = _cli("train", "--resume", "empty", "--json")
    assert result.exit_code == 2 and "run empty has no verified checkpoint" in result.output


def test_resume_of_an_unknown_run_names_it():
    result = _cli("train", "--resume", "nowhere", "--json")
    assert result.exit_code == 2 and "run 'nowhere' not found" in result.output


def test_resume_takes_the_runs_own_config_not_a_preset():
    result = _cli("train", "--resume", "x", "--preset", "tiny", "--json")
    assert result.exit_code == 2 and "drop CONFIG, --preset" in result.output


def test_init_from_a_folder_without_config_json_names_the_field(workspace):
    empty = workspace / "not-a-checkpoint"
    empty.mkdir(parents=True)
    result = _cli("train", "--init-from", str(empty), "--json")
    assert result.exit_code == 2
    assert "model.init_from=" in result.output and "has no config.json" in result.output


def test_init_from_dry_run_plans_the_checkpoints_shape(workspace):
    folder = _hf_folder(workspace / "hf")
    result = _cli("train", "--init-from", str(folder), "--nproc", "2", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.output)["ranks"]
    assert len(ranks) == 2 and ranks[0]["layers"] == [0, 1]


def test_export_of_a_missing_step_says_which_and_what_to_do(workspace):
    prepare_run(None, "tiny", ["checkpoint.enable=true"], run_id="noexport")
    result = _cli("export", "noexport", "--step", "3", "--to", str(workspace / "hf"), "--json")
    assert result.exit_code == 2 and "step-00000003 does not exist" in result.output


def _first_step_loss(folder: Path, cfg) -> float:
    """The HF model's mean loss over the first step's micro-batches (all data-parallel ranks')."""
    training = cfg.training
    loader = DataLoader(cfg.data, vocab_size=256, seq_len=training.seq_len, seed=training.seed,
                        global_batch=training.global_batch, micro_batch=training.micro_batch)
    model = import_hf(folder)
    micro_batches = loader.next_step()
    with torch.no_grad():
        return sum(torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                   for x, y in micro_batches) / len(micro_batches)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["parallel.pp=2", "parallel.pp_schedule=GPipe"], ["parallel.tp=2"]],
                         ids=["pp2", "tp2"])
def test_init_from_loads_each_ranks_part_under_pipeline_and_tensor_parallel(workspace, layout):
    folder = _hf_folder(workspace / "hf", tied=False)  # a tied model cannot be pipelined
    sets = [arg for override in layout for arg in ("--set", override)]
    result = _cli("train", "--init-from", str(folder), "--nproc", "2", "--set", "training.steps=1", *SHORT, *sets,
                  "--json")
    assert result.exit_code == 0, result.output
    run_dir = json.loads(result.output)["run_dir"]
    expected = _first_step_loss(folder, load_config(Path(run_dir) / "config.toml"))
    assert _rank0_records(run_dir)[0].loss == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_a_launch_passes_the_gate_and_lands_in_the_audit_log_as_the_operator(workspace):
    result = _cli("train", "--preset", "tiny", "--nproc", "1", "--set", "training.steps=2", *SHORT, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["status"] == "ok" and summary["steps_completed"] == 2 and summary["resumed_from"] is None
    entries = [json.loads(line) for line in (workspace / "audit.jsonl").read_text().splitlines()]
    submits = [e for e in entries if e.get("tool") == "submit_job"]
    assert submits and all(e["actor"] == "operator" for e in submits)
    assert any(summary["run_dir"] in json.dumps(e) for e in submits)


@pytest.mark.slow
def test_init_from_starts_a_two_process_fsdp_run_from_the_hf_weights_and_export_hands_it_back(tmp_path, workspace):
    folder = _hf_folder(workspace / "hf")  # weights are read from the workspace or a [governance] data root
    result = _cli("train", "--init-from", str(folder), "--nproc", "2", "--run-id", "from-hf",
                  "--set", "training.steps=2", "--set", "checkpoint.enable=true", "--set", "checkpoint.interval=1",
                  *SHORT, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    cfg = load_config(Path(summary["run_dir"]) / "config.toml")
    assert cfg.parallel.data_parallel == "fsdp" and cfg.model.init_from == str(folder)
    assert _rank0_records(summary["run_dir"])[0].loss == pytest.approx(_first_step_loss(folder, cfg), abs=1e-4)

    exported = tmp_path / "exported"
    result = _cli("export", "from-hf", "--step", "2", "--to", str(exported), "--max-shard-bytes", "200000", "--json")
    assert result.exit_code == 0, result.output
    assert "model.safetensors.index.json" in json.loads(result.output)["files"]
    theirs = LlamaForCausalLM.from_pretrained(exported, attn_implementation="eager").eval()
    ours, before = import_hf(exported).eval(), import_hf(folder)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens), atol=1e-4, rtol=0)
    trained = ours.layers["0"].attention.wq.weight
    assert not torch.equal(trained, before.layers["0"].attention.wq.weight)  # two steps moved it


@pytest.mark.slow
def test_a_run_killed_with_kill_9_resumes_from_its_newest_checkpoint(workspace):
    run_dir = workspace / "runs" / "victim"
    args = ["train", "--preset", "tiny", "--nproc", "2", "--run-id", "victim", "--set", "training.steps=10",
            "--set", "checkpoint.enable=true", "--set", "checkpoint.interval=2",
            "--set", "faults.slow_rank=0", "--set", "faults.slow_ms=400", *SHORT, "--json"]
    trainops = Path(sys.executable).parent / "trainops"
    cli = subprocess.Popen([str(trainops), *args], env=os.environ | {"TRAINOPS_HOME": str(workspace)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(c.committed and c.step >= 4 for c in list_checkpoints(run_dir / "checkpoints")),
                 120, "the step-4 checkpoint", poll_s=0.1)
    finally:  # the whole node goes: the CLI, the job's runner, torchrun and both ranks
        tree = [psutil.Process(cli.pid), *psutil.Process(cli.pid).children(recursive=True)]
        for proc in tree:
            proc.send_signal(signal.SIGKILL)
        cli.wait()
    killed_at = len(_rank0_records(run_dir))
    newest = max(c.step for c in list_checkpoints(run_dir / "checkpoints") if c.committed)
    assert killed_at < 10, "the run finished before it was killed: nothing was resumed"

    result = _cli("train", "--resume", "victim", "--set", "faults.slow_ms=0", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["resumed_from"].endswith(f"step-{newest:08d}")
    assert summary["status"] == "ok" and summary["steps_completed"] == 10
    resumed_steps = [r.step for r in _rank0_records(run_dir)][killed_at:]
    assert resumed_steps == list(range(newest + 1, 11))


@pytest.mark.slow
def test_resume_refuses_a_run_a_live_job_still_trains_in(workspace):
    run_dir = prepare_run(None, "tiny", ["checkpoint.enable=true", "training.steps=1000", "faults.hang_step=1"],
                          run_id="busy")
    ctx = CallContext(actor="operator")
    job = call("submit_job", {"scheduler": "local", "spec": trainer_job(run_dir, 1)}, ctx).handle
    try:
        result = _cli("train", "--resume", "busy", "--json")
        assert result.exit_code == 2 and f"run busy is still training in job {job.job_id}" in result.output
    finally:
        call("cancel_job", {"job_id": job.job_id, "force": True}, ctx)
