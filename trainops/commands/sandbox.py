"""`trainops sandbox up|down|status`: a real multi-node Slurm cluster of network-namespace nodes on
this host (trainops.tools.sandbox.cluster), for trying the multi-node SOP without a cluster."""
from __future__ import annotations

import typer
from pydantic import ValidationError

from trainops.output import console, emit, fail
from trainops.tools.base import explain
from trainops.tools.sandbox import cluster as sandbox
from trainops.tools.sandbox.metrics import EXPORTER_PORT_BASE

app = typer.Typer(help="A real Slurm cluster of network-namespace nodes on this host (root, Linux).",
                  no_args_is_help=True)
JsonOpt = typer.Option(False, "--json", help="Print the result as JSON.")
PrefixOpt = typer.Option("tos", "--prefix",
                         help="Names of its namespaces and links start with this (1-6 letters/digits).")


@app.command("up")
def up(
    nodes: int = typer.Option(3, "--nodes", help="Number of nodes n1..nN (1-64)."),
    net: str = typer.Option("10.251.7", "--net", help="First three octets of a private /24 nothing here uses."),
    cpus_per_node: int = typer.Option(2, "--cpus-per-node", help="CPUs each node declares to Slurm."),
    prometheus_port: int = typer.Option(0, "--prometheus-port",
                                        help="Also start a Prometheus on 127.0.0.1:PORT scraping every node's trainer "
                                             "exporters (0: none)."),
    prefix: str = PrefixOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Bring the cluster up (idempotent) and wait until every node is idle."""
    try:
        spec = sandbox.SandboxSpec(nodes=nodes, net=net, cpus_per_node=cpus_per_node, prefix=prefix,
                                   prometheus_port=prometheus_port)
        state = sandbox.up(spec)
    except ValidationError as exc:
        fail(f"invalid sandbox settings: {explain(exc)}", as_json=as_json)
    except sandbox.SandboxError as exc:
        fail(str(exc), as_json=as_json)
    export = f"export SLURM_CONF={state.conf} GLOO_SOCKET_IFNAME={sandbox.NODE_IF}"
    if state.prometheus_pid:
        export += f" TRAINOPS_PROMETHEUS_URL={sandbox.prometheus_url(spec)}"
    payload = {**sandbox.status(prefix), "export": export}
    emit(payload, as_json, _render_up)


def _render_up(payload: dict) -> None:
    out = console()
    out.print(f"sandbox up: {len(payload['nodes'])} nodes idle in {payload['bring_up_s']} s")
    for name, address in payload["addresses"].items():
        out.print(f"  {name}  {address}  {payload['nodes'].get(name, '?')}", markup=False)
    out.print("Point Slurm's CLI and trainops at it:")
    out.print(f"  {payload['export']}", markup=False)
    out.print("then submit with scheduler 'slurm', e.g. trainops tool call submit_job --input "
              "'{\"scheduler\": \"slurm\", \"training\": {\"preset\": \"tiny\", \"nodes\": 2}}'")
    if payload.get("prometheus"):
        out.print(f"Prometheus at {payload['prometheus']} scrapes every node: add \"metrics.prometheus_port_base="
                  f"{EXPORTER_PORT_BASE}\" to the job's overrides and query with monitor 'prometheus'", markup=False)


@app.command("down")
def down(prefix: str = PrefixOpt, as_json: bool = JsonOpt) -> None:
    """Remove every namespace, link and process the sandbox made, and nothing else."""
    try:
        removed = sandbox.down(prefix)
    except sandbox.SandboxError as exc:
        fail(str(exc), as_json=as_json)
    emit({"removed": removed}, as_json,
         lambda p: console().print(f"sandbox down: removed {len(p['removed'])} items" if p["removed"]
                                   else "no sandbox was up"))


@app.command("status")
def status(prefix: str = PrefixOpt, as_json: bool = JsonOpt) -> None:
    """Nodes and their Slurm state, the slurm.conf to use, the namespaces."""
    try:
        payload = sandbox.status(prefix)
    except sandbox.SandboxError as exc:
        fail(str(exc), as_json=as_json)
    emit(payload, as_json, _render_status)


def _render_status(payload: dict) -> None:
    out = console()
    if not payload["up"]:
        out.print("no sandbox is up; `trainops sandbox up --nodes N` starts one")
        return
    out.print(f"SLURM_CONF={payload['slurm_conf']}", markup=False)
    for name, state in payload["nodes"].items():
        out.print(f"  {name}  {payload['addresses'].get(name, '?')}  {state}", markup=False)
    accounting = payload.get("accounting")
    if accounting:
        answer = "answers" if accounting["answers"] else "does not answer (`trainops sandbox up` restarts it)"
        out.print(f"accounting: slurmdbd {accounting['slurmdbd']} cluster {accounting['cluster']} {answer}",
                  markup=False)
