"""The job every SOP step launches, as one typed request from the command line through the skills
to the `submit_job` tool: `JobRequest` extends the tools' TrainingJob (what to train) with where it
runs and how the SOP measures it. It lives beside the steps, not in one of them, so the CLI, the
steps and the agent's skills import it from one place."""
from __future__ import annotations

from pydantic import Field, model_validator

from trainops.tools.jobs.trainer_job import confine_init_from
from trainops.tools.schedulers.base import TrainingJob, partition_problem
from trainops.trainer.config import load_config, with_overrides


class JobRequest(TrainingJob):
    """A training job as the SOP launches it: the request, where it runs, and how it is measured."""

    preset: str | None = Field("tiny", description="model preset when no config is given")
    nproc: int = Field(2, ge=1, le=1024, description="processes (ranks) per node")
    scheduler: str = Field("local", description="local, slurm or kubernetes")
    timeout_s: float = Field(600.0, gt=0, description="give up waiting for one run after this long (it is cancelled)")
    warmup_steps: int = Field(2, ge=0, description="leading steps excluded from every statistic")
    framework_version: str = Field("undeclared",
                                   description="framework and torch versions stamped on evidence rows (from S1)")
    framework: str = Field("trainops",
                           description="whose job this is: trainops, deepspeed, torchtitan or megatron "
                                       "(trainops.tools.frameworks)")

    @model_validator(mode="after")
    def _partition_needs_slurm(self) -> JobRequest:
        """A partition means something to Slurm only: refused elsewhere, naming the fix, as SopSettings does
        (whether Slurm lists it is S1's check, skills.environment, and sbatch's at submission)."""
        if problem := partition_problem(self.partition, self.scheduler):
            raise ValueError(problem)
        return self

    def loaded(self) -> JobRequest:
        """The request with its trainer config loaded and validated, the one time its command does it;
        every step passes that typed config on (another framework's job keeps its own files)."""
        if self.framework != "trainops" or self.job_config is not None:
            return self
        confine_init_from(self)  # loading reads its config.json: confined first, as submit_job does
        return self.model_copy(update={"job_config": load_config(self.config, None if self.config else self.preset,
                                                                 self.overrides)})

    def with_overrides(self, extra: list[str], nproc: int | None = None) -> JobRequest:
        """The request with `extra` overrides after its own; a loaded config becomes the variant they
        make (trainops.trainer.config.with_overrides), so it stays the config of exactly these overrides."""
        config = None if self.job_config is None else with_overrides(self.job_config, extra)
        return self.model_copy(update={"overrides": [*self.overrides, *extra], "nproc": nproc or self.nproc,
                                       "job_config": config})
