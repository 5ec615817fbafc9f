"""The embedded trainer's job: a training request turned into a prepared run folder (config.toml,
logs/) and the torchrun command that trains it, its layout (nodes x processes per node) and folders
checked first (trainer.layout.validate_job_layout, tenancy.check_job_paths).

Below both the job tools (`submit_job` with a training request) and the trainer's framework
adapter (`TrainopsAdapter.build_job`), so neither imports the other."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from trainops.run_folder import new_run_folder
from trainops.settings import read_toml
from trainops.tools.changes.tenancy import check_job_paths, tenant_path
from trainops.tools.schedulers.base import JobSpec, TrainingJob
from trainops.trainer.launch import trainer_program
from trainops.trainer.layout import validate_job_layout
from trainops.workspace import confine


def _init_from(req: TrainingJob) -> str | None:
    """The Hugging Face folder a run starts from (`model.init_from`: in the config its command loaded, an
    override, or in the config TOML)."""
    if req.job_config is not None:
        return req.job_config.model.init_from
    for item in reversed(req.overrides):
        key, _, value = item.partition("=")
        if key.strip() == "model.init_from":
            return value.strip().strip("'\"") or None
    if req.config:
        model = read_toml(Path(req.config)).get("model", {})
        return model.get("init_from") if isinstance(model, dict) else None
    return None


def trainer_job(run_dir: str | Path, nproc: int, *, name: str = "train", nodes: int = 1,
                exclude_nodes: list[str] | None = None, tenant: str | None = None,
                partition: str | None = None) -> JobSpec:
    """The job that trains a prepared run folder: torchrun of the trainer's own program
    (trainops.trainer.launch.trainer_program), the one command line every trainer launch uses."""
    return JobSpec(name=name, command=trainer_program(run_dir), launcher="torchrun", nodes=nodes,
                   procs_per_node=nproc, run_dir=str(run_dir), exclude_nodes=list(exclude_nodes or []),
                   env={"OMP_NUM_THREADS": "1"}, tenant=tenant, partition=partition)


def check_layout(req: TrainingJob):
    """The request's config (as its command loaded it, else loaded now), once its layout fits the job's
    nodes x processes per node (LayoutError, a ValueError naming the numbers and the fix, otherwise):
    checked before any scheduler is asked."""
    config = req.trainer_config()
    validate_job_layout(config, req.nproc, req.nodes)
    return config



def confine_init_from(req: TrainingJob) -> None:
    """`model.init_from` confined before any config load reads its config.json, and before any run."""
    if init_from := _init_from(req):
        confine(init_from, "model.init_from", reading=True, must_exist=True)

def training_spec(req: TrainingJob, name: str, exclude_nodes: list[str], tenant: str | None = None) -> JobSpec:
    """Check the trainer run's folders, then prepare its run folder (config.toml, logs/) and
    build the torchrun job; a tenant's run folder lies in the tenant's root."""
    confine_init_from(req)
    config = check_layout(req)
    job = partial(trainer_job, nproc=req.nproc, name=name, nodes=req.nodes, exclude_nodes=exclude_nodes, tenant=tenant,
                  partition=req.partition)
    run_dir = new_run_folder(config.to_toml(), tenant_path(tenant, "runs") if tenant else None,
                             check=lambda path: check_job_paths(job(path), config))  # refused: no folder made
    return job(run_dir)
