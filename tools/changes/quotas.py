"""Tenant quotas and priority through Slurm's own accounting: a tenant is a Slurm account of the
same id, its quota the limits of a QOS of the same id (CPUs and GPUs as GrpTRES, running jobs as
GrpJobs), its priority that QOS's priority. The account's only QOS is the tenant's, so Slurm
itself holds a job over quota (pending, with its reason, e.g. QOSGrpCpuLimit).

`set_tenant_quota` reads the state from sacctmgr, applies the change, reads it back and records
a change (kind "tenant_quota") whose rollback commands are generated from the state read before;
`current_state` and `restore_commands` are what `rollback_change` uses (tools/changes/records.py).
"""
from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.changes.readback import quota_not_applied, roll_back_failed
from trainops.tools.changes.records import record_change, state_differences
from trainops.tools.ids import TenantId, check_tenant_id
from trainops.tools.schedulers.slurm import cluster_name

TOOL = "set_tenant_quota"
QOS_PRIORITY = {"low": 10, "normal": 100, "high": 1000}
"""QOS priority per class; with PriorityWeightQOS the highest QOS priority counts the whole weight."""
LIMITED_TRES = ("cpu", "gres/gpu")
"""The TRES this tool sets; a rollback clears the ones the previous state did not limit."""
SACCTMGR_TIMEOUT_S = 30
OWNED = "trainops tenant {tenant}"
"""The description trainops gives each account and QOS it makes: its mark of ownership, kept by Slurm."""
SLURM_MAX_COUNT = 0xFFFFFFFD
"""The largest count Slurm stores as itself: a uint32 field whose two top values mean INFINITE and NO_VAL
(GrpJobs=4294967296 wrapped to 0, no job may run)."""


class QuotaInput(BaseModel):
    tenant: TenantId = Field(description="Tenant id = Slurm account (and QOS) name: lowercase letters, digits, '_' "
                                         "and '-' (e.g. 'acme'). Created in Slurm if missing.")
    cpus: int | None = Field(None, ge=0, le=SLURM_MAX_COUNT, description="CPUs the tenant's running jobs may hold "
                                                                         "together (QOS GrpTRES cpu); None: no CPU "
                                                                         "limit.")
    gpus: int | None = Field(None, ge=0, le=SLURM_MAX_COUNT, description="GPUs the tenant's running jobs may hold "
                                                                         "together (QOS GrpTRES gres/gpu); None: no "
                                                                         "GPU limit.")
    max_jobs: int | None = Field(None, ge=1, le=SLURM_MAX_COUNT, description="Jobs of the tenant that may run at once "
                                                                             "(QOS GrpJobs); None: no job limit.")
    priority: Literal["low", "normal", "high"] = Field(description="Scheduling priority class (the QOS priority: "
                                                                   "low 10, normal 100, high 1000).")
    reason: str = Field(min_length=3, description="Why the change is needed; shown to the approver.")
    emergency: bool = Field(False, description="Land outside a change window; needs one more approver.")

    @model_validator(mode="after")
    def _one_limit(self) -> QuotaInput:
        if self.cpus is None and self.gpus is None and self.max_jobs is None:
            raise ValueError("give at least one limit: cpus, gpus or max_jobs (a quota without one limits nothing)")
        return self


class QuotaOutput(BaseModel):
    tenant: str
    change_id: str = Field(description="The recorded change; `trainops rollback CHANGE` undoes it.")
    previous: dict[str, Any] = Field(description="The tenant's account and QOS as sacctmgr showed them before.")
    current: dict[str, Any] = Field(description="As sacctmgr shows them now, after the change.")
    rollback_commands: list[list[str]]


def _sacctmgr(args: list[str]) -> str:
    """Run sacctmgr; a ToolError that names the fix when accounting cannot be reached."""
    conf = os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not Path(conf).is_file():
        raise ToolError(TOOL, f"no Slurm accounting reachable: {conf} does not exist; start `trainops sandbox up` and "
                              "export the SLURM_CONF it prints, or point SLURM_CONF at a cluster whose slurm.conf "
                              "uses slurmdbd (AccountingStorageType=accounting_storage/slurmdbd)")
    try:
        done = subprocess.run(["sacctmgr", *args], capture_output=True, text=True, timeout=SACCTMGR_TIMEOUT_S)
    except FileNotFoundError:
        raise ToolError(TOOL, "sacctmgr is not installed; install Debian's slurm-client (tests/services/install.sh)"
                        ) from None
    except subprocess.TimeoutExpired:
        raise ToolError(TOOL, f"sacctmgr gave no answer in {SACCTMGR_TIMEOUT_S} s; is slurmdbd running? "
                              "`trainops sandbox status` shows the sandbox's") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        detail_line = detail[-1] if detail else f"exit code {done.returncode}"
        if any(word in (done.stderr or "") for word in ("accounting_storage", "onnect", "database")):
            raise ToolError(TOOL, f"no Slurm accounting reachable ({detail_line}); start `trainops sandbox up` and "
                                  f"export its SLURM_CONF, or configure slurmdbd for the cluster in {conf}")
        raise ToolError(TOOL, f"`sacctmgr {' '.join(args)}` failed: {detail_line}")
    return done.stdout


def _rows(args: list[str]) -> list[list[str]]:
    """sacctmgr's parsable rows: every field ends with '|' (so an empty last field is kept)."""
    return [line.removesuffix("|").split("|") for line in _sacctmgr(["-n", "-p", *args]).splitlines() if line.strip()]


def cluster() -> str:
    return cluster_name()


def _parse_tres(text: str) -> dict[str, int]:
    pairs = (item.partition("=") for item in text.split(",") if item)
    return {name: int(value) for name, _, value in pairs if value.isdigit()}


def current_state(target: str) -> dict[str, Any]:
    """The tenant's account (its users, QOS list, default QOS) and its QOS's limits, read from sacctmgr now."""
    tenant = check_tenant_id(target)
    qos_rows = _rows(["show", "qos", "where", f"name={tenant}", "format=name,grptres,grpjobs,priority"])
    assoc_rows = _rows(["show", "assoc", "where", f"account={tenant}", f"cluster={cluster()}",
                        "format=account,user,qos,defaultqos"])
    account_row = next((row for row in assoc_rows if row[1] == ""), None)
    qos = next((row for row in qos_rows if row[0] == tenant), None)
    return {
        "account_record": bool(_rows(["show", "account", "where", f"name={tenant}", "format=account"])),
        "account": account_row is not None,
        "users": sorted(row[1] for row in assoc_rows if row[1]),
        "account_qos": sorted(q for q in account_row[2].split(",") if q) if account_row else [],
        "default_qos": account_row[3] if account_row else "",
        "qos": qos is not None,
        "grp_tres": _parse_tres(qos[1]) if qos else {},
        "grp_jobs": int(qos[2]) if qos and qos[2].isdigit() else None,
        "priority": int(qos[3]) if qos and qos[3].isdigit() else None,
    }


def known_tres() -> set[str]:
    """The TRES this cluster's accounting counts (gres/gpu only with AccountingStorageTRES=gres/gpu)."""
    return {f"{row[0]}/{row[1]}" if row[1] else row[0] for row in _rows(["show", "tres", "format=type,name"])}


def _qos_settings(grp_tres: dict[str, int], grp_jobs: int | None, priority: int | None) -> list[str]:
    """`set` arguments giving the QOS exactly these limits (-1 clears one the cluster counts)."""
    counted = known_tres()
    tres = {name: grp_tres.get(name, -1) for name in (*(t for t in LIMITED_TRES if t in counted), *grp_tres)}
    return [f"GrpTRES={','.join(f'{name}={value}' for name, value in tres.items())}",
            f"GrpJobs={-1 if grp_jobs is None else grp_jobs}", f"Priority={priority or 0}"]


def _account_settings(account_qos: list[str], default_qos: str) -> list[str]:
    return [f"QOS={','.join(account_qos) or '-1'}", f"DefaultQOS={default_qos or '-1'}"]


def restore_commands(target: str, previous: dict[str, Any]) -> list[list[str]]:
    """sacctmgr argv that puts the tenant's account and QOS back as `previous` recorded them, from
    `previous` alone (so a rollback can check the stored commands against it): an account or QOS
    that did not exist is deleted (the account with its users), the user `set_tenant_quota` adds
    is removed again, the rest get their recorded QOS list and limits back."""
    tenant, name, user = check_tenant_id(target), cluster(), getpass.getuser()
    commands = []
    if not previous["account_record"]:  # the account did not exist anywhere: remove it whole
        commands.append(["sacctmgr", "-i", "delete", "account", f"name={tenant}"])
    elif not previous["account"]:
        commands.append(["sacctmgr", "-i", "delete", "account", f"name={tenant}", f"cluster={name}"])
    else:
        if user not in previous["users"]:
            commands.append(["sacctmgr", "-i", "delete", "user", f"name={user}", f"account={tenant}",
                             f"cluster={name}"])
        commands.append(["sacctmgr", "-i", "modify", "account", "where", f"name={tenant}", f"cluster={name}", "set",
                         *_account_settings(previous["account_qos"], previous["default_qos"])])
    if previous["qos"]:
        commands.append(["sacctmgr", "-i", "modify", "qos", "where", f"name={tenant}", "set",
                         *_qos_settings(previous["grp_tres"], previous["grp_jobs"], previous["priority"])])
    else:
        commands.append(["sacctmgr", "-i", "delete", "qos", f"name={tenant}"])
    return commands


def _apply(inp: QuotaInput, before: dict[str, Any]) -> None:
    tenant, name, user = inp.tenant, cluster(), getpass.getuser()
    if not before["qos"]:
        _sacctmgr(["-i", "add", "qos", tenant, f"description={OWNED.format(tenant=tenant)}"])
    tres = {key: value for key, value in (("cpu", inp.cpus), ("gres/gpu", inp.gpus)) if value is not None}
    if "gres/gpu" in tres and "gres/gpu" not in known_tres():
        raise ToolError(TOOL, "this cluster's accounting does not count GPUs: add AccountingStorageTRES=gres/gpu "
                              "(and GresTypes=gpu) to slurm.conf and restart slurmctld, or give the quota as cpus")
    _sacctmgr(["-i", "modify", "qos", "where", f"name={tenant}", "set",
               *_qos_settings(tres, inp.max_jobs, QOS_PRIORITY[inp.priority])])
    if not before["account"]:
        _sacctmgr(["-i", "add", "account", tenant, f"cluster={name}", f"description={OWNED.format(tenant=tenant)}"])
    # the tenant's QOS is its account's only one: a job cannot pick another QOS to escape the quota
    _sacctmgr(["-i", "modify", "account", "where", f"name={tenant}", f"cluster={name}", "set",
               *_account_settings([tenant], tenant)])
    if user not in before["users"]:
        _sacctmgr(["-i", "add", "user", user, f"account={tenant}", f"cluster={name}"])


def not_owned(inp: QuotaInput) -> str | None:
    """Why the tenant's name may not be taken: an account or QOS of that name that Slurm holds and trainops
    did not make (its description, which only Slurm's administrators can write, is not trainops' mark).
    Its limits are someone else's; a quota would rewrite them, and the rollback of the first change would
    delete them."""
    try:
        marks = {kind: {row[0]: row[1] for row in _rows(["show", kind, "where", f"name={inp.tenant}",
                                                          f"format={column},description"])}
                 for kind, column in (("account", "account"), ("qos", "name"))}
    except ToolError:  # no accounting to ask: the call itself fails on it (the gate asks again when it runs)
        return None
    mine = OWNED.format(tenant=inp.tenant)
    foreign = [kind for kind, rows in marks.items() if inp.tenant in rows and rows[inp.tenant] != mine]
    if foreign:
        return (f"tenant {inp.tenant!r} names an existing Slurm {' and '.join(foreign)} that trainops did not make "
                f"(its description is not {mine!r}): its limits belong to someone else; choose a tenant id of its "
                "own, or have a Slurm administrator set that description if it is meant to be trainops'")
    return None


def approved_state(inp: QuotaInput) -> dict[str, Any]:
    """The fields of current_state that the approved quota sets, as sacctmgr must then show them."""
    tres = {key: value for key, value in (("cpu", inp.cpus), ("gres/gpu", inp.gpus)) if value is not None}
    return {"account": True, "qos": True, "account_qos": [inp.tenant], "default_qos": inp.tenant,
            "users": [getpass.getuser()], "grp_tres": tres, "grp_jobs": inp.max_jobs,
            "priority": QOS_PRIORITY[inp.priority]}


@tool(TOOL, risk="mutate", approval_required=True, tags=("tenant-governance", "change-window"),
      checks=(InputCheck("R-SEC-3", not_owned),))
def set_tenant_quota(inp: QuotaInput) -> QuotaOutput:
    """Set a tenant's quota and priority in Slurm's accounting: the tenant becomes (or stays) a Slurm
    account whose only QOS carries the limits (cpus and/or gpus as GrpTRES, max_jobs as GrpJobs) and
    the priority class, so Slurm holds the tenant's jobs beyond them. Records the change with the
    commands that undo it (`trainops rollback CHANGE`). Needs a human approval token for this exact
    change; without one the call is queued as a pending approval."""
    before = current_state(inp.tenant)
    rollback = restore_commands(inp.tenant, before)
    _apply(inp, before)
    after = current_state(inp.tenant)
    if missed := quota_not_applied(approved_state(inp), after):
        def undo() -> list[str]:
            for argv in rollback:
                _sacctmgr(argv[1:])
            return state_differences(before, current_state(inp.tenant))

        raise roll_back_failed(TOOL, f"the quota change for tenant {inp.tenant}", "tenant", "sacctmgr", missed, undo)
    record = record_change("tenant_quota", inp.tenant, before, after, rollback, {"reason": inp.reason})
    return QuotaOutput(tenant=inp.tenant, change_id=record.id, previous=before, current=after,
                       rollback_commands=rollback)
