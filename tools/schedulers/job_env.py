"""The environment a job starts with: an allow-list, never the operator's whole environment.

A job runs code trainops does not vouch for (a framework, a user's script, a poisoned config),
with the operator's uid. What it inherits it can use: an ssh-agent socket signs approvals
(`trainops approve` through SSH_AUTH_SOCK was seen), API keys and tokens reach the provider as
the operator, and trainops' own config variables point at the signers file and the user's
settings. So a job gets only what the trainer, torchrun and the scheduler need (ALLOWED), the
workspace's absolute path, and the variables its spec names, which may never be secret-shaped
or trainops' configuration (DENIED)."""
from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping

from trainops.settings import workspace_path
from trainops.tools.schedulers.base import JobSpec, SchedulerError

# set on a local job's launcher only (processes.py reads it back); the command does not inherit it
LAUNCHER_MARKER = "TRAINOPS_LOCAL_JOB"
ALLOWED = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "TMPDIR",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
    "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_DEVICE_ORDER",
    "NCCL_*", "GLOO_*", "TORCH_*", "TORCHELASTIC_*", "TORCHINDUCTOR_*", "TRITON_*", "HF_HOME", "HF_HUB_OFFLINE",
    "TRAINOPS_HOME",
)
SLURM_ALLOWED = ("SLURM_*",)  # inside a Slurm job only: slurmd sets these for the job
DENIED = (
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO", "*_API_KEY", "*_TOKEN", "*_SECRET", "*_SECRET_*",
    "*PASSWORD*", "*_CREDENTIALS", "AWS_*", "XDG_CONFIG_HOME", "KUBECONFIG", "DBUS_SESSION_BUS_ADDRESS",
    "TRAINOPS_CONFIG", "TRAINOPS_ALLOWED_SIGNERS", "TRAINOPS_APPROVER", "TRAINOPS_API_KEY_ENV",
    "TRAINOPS_PROVIDER", "TRAINOPS_MODEL", "TRAINOPS_BASE_URL", "TRAINOPS_PROMETHEUS_URL",
)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def allowed(name: str, *, slurm: bool = False) -> bool:
    """Whether a variable of the operator's environment may reach a job."""
    return not _matches(name, DENIED) and _matches(name, ALLOWED + (SLURM_ALLOWED if slurm else ()))


def check_spec_env(spec: JobSpec, backend: str) -> dict[str, str]:
    """The spec's own variables, refused by name when secret-shaped or trainops' configuration."""
    denied = sorted(key for key in spec.env if _matches(key, DENIED))
    if denied:
        raise SchedulerError(backend, f"spec.env names {', '.join(denied)}: a job never gets the operator's "
                                      "ssh-agent, API keys, tokens or trainops' configuration; remove "
                                      f"{'it' if len(denied) == 1 else 'them'} from spec.env")
    return dict(spec.env)


def job_environment(spec: JobSpec, backend: str, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a job started here: the allowed part of `source` (the operator's
    environment), TRAINOPS_HOME as the workspace's absolute path, then the spec's variables."""
    source = os.environ if source is None else source
    env = {key: value for key, value in source.items() if allowed(key)}
    env["TRAINOPS_HOME"] = str(workspace_path())
    env.update(check_spec_env(spec, backend))
    return env


def shell_filter(*, slurm: bool = True) -> list[str]:
    """Batch-script lines that unset every exported variable the allow-list does not name (what
    pyslurm, or sbatch before --export=NONE, carried from the submitting shell), with the same
    patterns; srun then passes the batch shell's environment, so SLURM_EXPORT_ENV goes too."""
    keep = "|".join(ALLOWED + (SLURM_ALLOWED if slurm else ()))
    drop = "|".join(DENIED)
    return ['for _var in $(compgen -e); do',
            f'  case "$_var" in {drop}) unset "$_var" 2>/dev/null || true ;; {keep}) ;; '
            '*) unset "$_var" 2>/dev/null || true ;; esac',
            'done', 'unset _var SLURM_EXPORT_ENV']
