"""`#SBATCH` values cannot smuggle shell lines into a batch script: every value is checked for
newlines, control characters and double quotes (a named error) and double-quoted, and the real
`sbatch` reads the quoted values back as they were meant."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from pydantic import ValidationError

from trainops.tools.schedulers.base import JobSpec, SchedulerError
from trainops.tools.schedulers.slurm import SlurmScheduler, batch_script


def _spec(**kw) -> JobSpec:
    return JobSpec(**{"name": "drill", "command": ["true"], **kw})


def _unchecked_spec(**kw) -> JobSpec:
    """A spec that skipped JobSpec's own field patterns (built in code, or a model changed after validation):
    the batch script must still refuse what would add a line to it."""
    return JobSpec.model_construct(**{"name": "drill", "command": ["true"], **kw})


@pytest.mark.parametrize("field, value", [
    ("partition", "debug\ntouch /tmp/pwned"),
    ("partition", "debug\rtouch /tmp/pwned"),
    ("workdir", "/tmp\n/bin/sh -c id"),
    ("exclude_nodes", ["n01", "n02\ncurl evil"]),
    ("partition", 'debug" --wrap="id'),
    ("workdir", "/tmp/\x1b[2Jclear"),
])
def test_a_value_with_a_newline_control_character_or_quote_is_refused_naming_the_field(field, value):
    with pytest.raises(SchedulerError, match=rf"slurm scheduler: {field}=.* contains"):
        batch_script(_unchecked_spec(**{field: value}), "/logs/job.log")


@pytest.mark.parametrize("field, value", [("partition", "debug\ntouch /tmp/pwned"), ("partition", 'debug" --wrap="id'),
                                          ("exclude_nodes", ["n01", "n02\ncurl evil"])])
def test_a_scheduler_name_field_with_a_newline_or_quote_is_refused_at_the_spec_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        _spec(**{field: value})


def test_the_scheduler_refuses_an_injected_partition_before_anything_reaches_sbatch(workspace):
    marker = workspace / "pwned"
    with pytest.raises(SchedulerError, match="partition=.* contains '\\\\n'"):
        SlurmScheduler().submit(_unchecked_spec(partition=f"debug\ntouch {marker}"))
    assert not marker.exists() and not list(workspace.rglob("*.sbatch"))


def test_no_value_adds_a_line_to_the_script():
    script = batch_script(_spec(partition="debug", workdir="/tmp/with space", exclude_nodes=["n1", "n2"]), "/l/o g.log")
    assert [line for line in script.splitlines() if not line.startswith("#")][0] == "set -euo pipefail"
    assert '#SBATCH --chdir="/tmp/with space"' in script.splitlines()


def test_the_real_sbatch_reads_the_quoted_values_back_unchanged(tmp_path, require_service):
    """sbatch parses the #SBATCH lines itself before it contacts the controller; a controller on a
    closed port makes it print its options (-vv) and stop at once."""
    require_service(shutil.which("sbatch") is not None, "sbatch is not installed; run tests/services/install.sh")
    workdir = tmp_path / "a dir with spaces"
    workdir.mkdir()
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nSlurmctldPort=1\nMessageTimeout=1\nAuthType=auth/none\n"
                    "NodeName=localhost CPUs=1\nPartitionName=debug Nodes=localhost Default=YES\n")
    script = tmp_path / "job.sbatch"
    script.write_text(batch_script(_spec(partition="debug", workdir=str(workdir), exclude_nodes=["n1", "n2"]),
                                   str(tmp_path / "job log.txt")))
    out = subprocess.run(["sbatch", "-vv", str(script)], capture_output=True, text=True, timeout=30,
                         env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}).stderr
    options = dict(re.findall(r"sbatch: (\S+)\s+: (.*)", out))
    assert options["chdir"] == str(workdir) and options["partition"] == "debug"
    assert options["exclude"] == "n1,n2" and options["job-name"] == "drill"
