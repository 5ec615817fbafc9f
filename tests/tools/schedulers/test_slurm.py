"""The Slurm backend's pure parts: the batch script it generates and the scontrol parser.
The live backend is exercised against a real slurmctld in tests/integration."""
from __future__ import annotations

import subprocess
import sys

import pytest

from trainops.record_keys import RECORD_KEY_ENV
from trainops.tools.schedulers import JobSpec, SchedulerError
from trainops.tools.schedulers.slurm import SlurmScheduler, batch_script, sbatch_options
from trainops.tools.schedulers.slurm_transport import accounted_launches, parse_scontrol
from trainops.trainer.config import load_config
from trainops.trainer.launch import prepare_run


def _spec(**kw) -> JobSpec:
    base = dict(name="drill", command=["-m", "trainops.trainer.train", "--run-dir", "/runs/r 1"], launcher="torchrun",
                nodes=2, procs_per_node=4, exclude_nodes=["n07", "n09"], time_limit_min=30, partition="gpu",
                env={"OMP_NUM_THREADS": "1"}, run_dir="/runs/r 1")
    return JobSpec(**{**base, **kw})


def test_the_script_asks_for_the_spec_resources_and_excludes_nodes():
    script = batch_script(_spec(), "/logs/job.log")
    for line in ('#SBATCH --job-name="drill"', '#SBATCH --nodes="2"', "#SBATCH --ntasks-per-node=1",
                 '#SBATCH --cpus-per-task="4"', '#SBATCH --time="30"', '#SBATCH --partition="gpu"',
                 '#SBATCH --exclude="n07,n09"', '#SBATCH --output="/logs/job.log"', "#SBATCH --requeue",
                 "export OMP_NUM_THREADS=1"):
        assert line in script.splitlines()


def test_multi_node_runs_torchrun_under_srun_with_c10d_rendezvous_on_the_first_node():
    script = batch_script(_spec(), "/logs/job.log")
    launch = next(line for line in script.splitlines() if line.startswith("srun"))
    assert f"{sys.executable} -m trainops.trainer.warm_launch --nnodes \"$SLURM_NNODES\" --nproc-per-node 4" in launch
    assert '--rdzv-backend c10d --rdzv-endpoint "$head_node:29500"' in launch
    assert "-m trainops.trainer.train --run-dir '/runs/r 1'" in launch
    assert "trainops.tools.schedulers.run_status '/runs/r 1' \"$rc\"" in script


def test_with_in_process_restart_each_node_runs_its_own_supervisor_step_and_spare_nodes_are_allocated(workspace):
    """The job holds its spare nodes (--nodes 2 + 1), survives a lost node (--no-kill: through
    pyslurm too, which reads no #SBATCH line), and runs one supervisor per node as its own step,
    node 0 leading with the store on the rendezvous port; the script is valid bash."""
    run_dir = prepare_run(load_config(None, "tiny", ["resilience.in_process_restart=true", "resilience.spare_nodes=1"]),
                          run_id="spared")
    spec = _spec(command=["-m", "trainops.trainer.train", "--run-dir", str(run_dir)], run_dir=str(run_dir))
    assert ("nodes", "3") in sbatch_options(spec, "/l") and ("no-kill", "on") in sbatch_options(spec, "/l")
    script = batch_script(spec, "/logs/job.log")
    # sbatch itself reads the #SBATCH lines on the CLI transport: a switch with a value is refused
    assert "#SBATCH --no-kill\n" in script and "--no-kill=" not in script
    steps = [line.strip() for line in script.splitlines() if line.strip().startswith("srun")]
    assert len(steps) == 2 and all("-m trainops.trainer.supervisor" in step for step in steps)
    agents, leader = steps
    assert '--node-index "$index"' in agents and agents.endswith("&") and '--nodelist="${nodes[$index]}"' in agents
    assert "--node-index 0" in leader and '--nodelist="$head_node"' in leader
    for step in steps:
        assert '--nnodes 2 --spare-nodes 1' in step and '--store "$head_node:29500"' in step
    assert "torch.distributed.run" not in script
    assert script.count(f"export {RECORD_KEY_ENV}=") == 1  # the run's key for its supervisors (record_keys.py)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    off = _spec(command=["-m", "trainops.trainer.train", "--run-dir", str(prepare_run(load_config(None, "tiny"),
                                                                                           run_id="plain"))])
    assert ("nodes", "2") in sbatch_options(off, "/l") and "no-kill" not in dict(sbatch_options(off, "/l"))
    assert RECORD_KEY_ENV not in batch_script(off, "/l")  # no supervisor: no key


def test_a_plain_command_runs_once_without_srun():
    script = batch_script(JobSpec(name="p", command=["echo", "a b"]), "/l")
    assert script.splitlines()[-1] == "echo 'a b'"
    assert "srun" not in script


def test_scontrol_output_parses_into_fields():
    fields = parse_scontrol("JobId=7 JobName=drill\n   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)\n   "
                            "ExitCode=1:0 NodeList=vm")
    assert (fields["JobState"], fields["ExitCode"], fields["NodeList"]) == ("FAILED", "1:0", "vm")


def test_a_non_numeric_job_id_is_refused_before_any_command_runs():
    with pytest.raises(SchedulerError, match=r"slurm scheduler: job id 'abc' is not a Slurm job id"):
        SlurmScheduler().status("abc")


def test_a_missing_slurm_conf_is_refused_at_once_naming_the_path(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(SchedulerError, match=r"slurm scheduler: SLURM_CONF=.*missing.conf does not exist"):
        SlurmScheduler().list_nodes()


def test_the_launches_of_a_job_slurm_requeued_are_read_from_its_accounting(monkeypatch):
    """`sacct --duplicates` keeps one row per launch of a requeued job (the one record of the launch a
    node failure ended); without accounting there are none."""
    rows = ("7|train|NODE_FAIL|0:0|2026-12-07T01:47:00|2026-12-07T01:47:10|2026-12-07T01:47:38|n[1-2]\n"
            "7|train|CANCELLED by 0|0:15|2026-12-07T01:47:38|2026-12-07T01:47:50|2026-12-07T01:49:20|n[1,3]\n"
            "70|other|FAILED|1:0|2026-12-07T01:40:00|2026-12-07T01:40:01|2026-12-07T01:40:02|n1\n")
    answers = iter([subprocess.CompletedProcess([], 0, rows, ""),
                    subprocess.CompletedProcess([], 1, "", "Slurm accounting storage is disabled")])
    monkeypatch.setattr("trainops.tools.schedulers.slurm_transport.run_cli", lambda args, check=True: next(answers))
    first, second = accounted_launches("7")
    assert (first.state, first.nodelist, second.state, second.exit_signal) == ("NODE_FAIL", "n[1-2]", "CANCELLED", 15)
    assert first.started_at < first.ended_at <= second.started_at
    assert accounted_launches("7") == []
