"""A command loads its job's config once (JobRequest.loaded) and passes the typed config on: the
submit's layout check, the plan_layout tool and the ablation's weak-scaling batch read it from the
request, and a variant (an arm, a drill's settings) is the loaded config with its overrides applied,
never the file read again. A run's own RUN/config.toml is another fact (what ran) and is still read."""
from __future__ import annotations

import pytest

from trainops.skills import labels, planning
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.jobs import trainer_job
from trainops.tools.jobs.jobs import SubmitJobInput
from trainops.tools.planning import layout
from trainops.tools.schedulers import base
from trainops.trainer.config import load_config

JOB = ["training.steps=10", "training.global_batch=8", "training.micro_batch=2"]
ARM = ["parallel.tp=2", "training.micro_batch=1"]


@pytest.fixture
def config_file(workspace):
    path = workspace / "job.toml"
    workspace.mkdir(parents=True, exist_ok=True)
    path.write_text('[model]\npreset = "tiny"\n\n[training]\nsteps = 10\nglobal_batch = 8\nmicro_batch = 2\n')
    return path


@pytest.fixture
def no_second_load(monkeypatch):
    """After the command's one load, any other load of the request's config fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError(f"the config was loaded again: load_config{args}")

    for module in (base, layout):
        monkeypatch.setattr(module, "load_config", refused)


def test_a_variant_of_the_loaded_config_is_the_config_its_overrides_would_load(config_file):
    req = JobRequest(config=str(config_file), preset=None).loaded()
    arm = req.with_overrides(ARM, nproc=4)
    assert arm.job_config == load_config(config_file, None, ARM) and arm.nproc == 4
    assert req.job_config == load_config(config_file)  # the request it came from keeps its own


def test_the_submit_check_the_plan_and_the_batch_use_the_loaded_config(config_file, factories, no_second_load):
    req = JobRequest(config=str(config_file), preset=None, nproc=2).loaded()
    config_file.write_text("not toml: the command read it once, before this")
    assert trainer_job.check_layout(req.with_overrides(ARM)).parallel.tp == 2
    assert labels.shape_of_request(req, 2).global_batch == 8
    assert planning.layout_plan(req, factories.environment()).valid


def test_a_request_without_a_loaded_config_still_loads_it_where_it_is_needed():
    req = JobRequest(preset="tiny", overrides=JOB, nproc=2)
    assert req.job_config is None and trainer_job.check_layout(req).training.global_batch == 8


def test_another_frameworks_request_loads_no_trainer_config():
    assert JobRequest(framework="deepspeed", preset="tiny").loaded().job_config is None


def test_a_caller_cannot_hand_the_tools_a_config_of_its_own():
    """The loaded config travels typed, inside trainops: a model or a JSON caller names config, preset and
    overrides (which the audit log records), never a config object the log would not show."""
    assert "job_config" not in str(SubmitJobInput.model_json_schema())
    with pytest.raises(ToolError, match="job_config"):
        call("plan_layout", {"preset": "tiny", "nproc": 2, "job_config": {"model": {"preset": "small"}}})
