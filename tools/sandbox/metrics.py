"""A Prometheus for a sandbox cluster: it scrapes the trainer's per-rank exporters on every
namespace node (rank R serves on EXPORTER_PORT_BASE + R on its own node's address), each target
labelled with its node, so the monitoring tools can aggregate per node as on a real cluster.
Prometheus runs in the host's namespace, which reaches every node over the sandbox's bridge."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

EXPORTER_PORT_BASE = 17900
"""The `metrics.prometheus_port_base` a sandbox job uses for its exporters to be scraped."""


def prometheus_config(spec) -> dict:
    """One static target group per node: a port for every rank the cluster's CPUs could host."""
    ranks = spec.nodes * spec.cpus_per_node
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "trainops-sandbox", "static_configs": [
            {"targets": [f"{spec.address(k)}:{EXPORTER_PORT_BASE + rank}" for rank in range(ranks)],
             "labels": {"node": f"n{k}"}} for k in range(1, spec.nodes + 1)]}],
    }


def prometheus_url(spec) -> str:
    return f"http://127.0.0.1:{spec.prometheus_port}"


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def start_prometheus(state, wait_until) -> int:
    """Start the sandbox's Prometheus (config, data and log in the sandbox folder); its pid."""
    folder = Path(state.folder)
    config = folder / "prometheus.yml"
    config.write_text(json.dumps(prometheus_config(state.spec), indent=1))  # JSON is YAML
    with open(folder / "log" / "prometheus.log", "ab") as log:
        process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{state.spec.prometheus_port}",
             f"--storage.tsdb.path={folder / 'state' / 'prometheus'}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = prometheus_url(state.spec)
    wait_until(30, f"Prometheus at {url}/-/ready (see {folder}/log/prometheus.log)",
               lambda: process.poll() is None and _ready(url))
    return process.pid


def stop_prometheus(state) -> bool:
    """SIGTERM the sandbox's Prometheus, only if that pid still runs this sandbox's config."""
    config = str(Path(state.folder) / "prometheus.yml")
    try:
        if config not in Path(f"/proc/{state.prometheus_pid}/cmdline").read_bytes().decode(errors="replace"):
            return False
        os.kill(state.prometheus_pid, signal.SIGTERM)
        return True
    except (OSError, TypeError):
        return False
