"""Environment declaration on this machine: every field filled, bandwidth and peak measured."""
from __future__ import annotations

import shutil
import socket
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.environment.probes import cpu_facts, gpu_generation, parse_gpu_query, parse_topology

SMALL = {"ckpt_test_mib": 4}


@pytest.fixture(scope="module")
def declaration(tmp_path_factory):
    """One declaration for the field checks (it measures, so it is not free)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINOPS_HOME", str(tmp_path_factory.mktemp("home")))
        return call("declare_environment", SMALL)


def test_accelerators_are_this_hosts(declaration):
    acc = declaration.accelerators
    if shutil.which("nvidia-smi") is None:
        assert acc.kind == "cpu" and acc.cpu_physical_cores >= 1 and acc.count >= 1
        assert declaration.interconnect == "loopback/shared-memory (single host)"
    else:
        assert acc.kind == "gpu" and acc.memory_gib > 0


def test_software_versions_are_the_running_ones(declaration):
    sw = declaration.software
    assert sw.torch == torch.__version__ and sw.cuda == torch.version.cuda
    assert sw.gloo is True
    assert sw.distributed_backend == ("nccl" if torch.cuda.is_available() else "gloo")


def test_framework_defaults_to_the_embedded_trainer_with_its_version(declaration):
    assert declaration.framework.name == "trainops-embedded-trainer"
    assert declaration.framework.version == version("trainops")


def test_local_scheduler_reports_this_host_and_no_hot_spare(declaration):
    """The one local node is where the job runs, not a spare that could replace it."""
    assert declaration.scheduler.kind == "local"
    assert declaration.scheduler.nodes == [socket.gethostname()]
    assert declaration.scheduler.hot_spare_nodes == []


def test_checkpoint_write_bandwidth_is_measured(declaration):
    storage = declaration.checkpoint_storage
    assert storage.test_size_mib == 4 and storage.write_s > 0 and storage.write_bandwidth_mib_s > 0
    assert storage.filesystem != ""


def test_compute_peak_is_measured_or_from_the_vendor_table(declaration):
    peak = declaration.compute_peak
    assert peak.peak_tflops > 0
    assert peak.source.startswith("measured-gemm" if declaration.accelerators.kind == "cpu" else "vendor-table")


def test_write_test_goes_to_the_given_checkpoint_dir_and_leaves_nothing(workspace):
    folder = workspace / "ckpts"
    folder.mkdir(parents=True)
    out = call("declare_environment", SMALL | {"ckpt_dir": str(folder), "measure_gemm": False})
    assert out.checkpoint_storage.path == str(folder)
    assert list(folder.iterdir()) == []


def test_a_missing_checkpoint_dir_is_a_clear_error_and_is_not_created(workspace):
    with pytest.raises(ToolError, match=r"ckpt_dir='.*absent' does not exist"):
        call("declare_environment", SMALL | {"ckpt_dir": str(workspace / "absent"), "measure_gemm": False})
    assert not (workspace / "absent").exists()


def test_a_checkpoint_dir_that_is_a_file_is_a_clear_error(workspace):
    blocker = workspace / "a-file"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("")
    with pytest.raises(ToolError, match="ckpt_dir=.* is not a folder"):
        call("declare_environment", SMALL | {"ckpt_dir": str(blocker), "measure_gemm": False})


def test_a_declared_framework_needs_its_version():
    with pytest.raises(ToolError, match="framework_version"):
        call("declare_environment", {"framework": "Megatron-LM"})


def test_a_declared_framework_is_reported_as_declared():
    out = call("declare_environment",
               SMALL | {"framework": "Megatron-LM", "framework_version": "0.12.0", "measure_gemm": False})
    assert (out.framework.name, out.framework.version) == ("Megatron-LM", "0.12.0")


def test_slurm_without_its_commands_names_the_backend(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolError, match="slurm scheduler: `sinfo` is not installed"):
        call("declare_environment", SMALL | {"scheduler": "slurm", "measure_gemm": False})


def test_kubernetes_without_a_cluster_names_the_backend(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    with pytest.raises(ToolError, match="kubernetes: no reachable cluster"):
        call("declare_environment", SMALL | {"scheduler": "kubernetes", "measure_gemm": False})


def test_cpu_facts_from_this_hosts_cpuinfo():
    facts = cpu_facts(Path("/proc/cpuinfo").read_text())
    assert facts["model"] != "unknown CPU" and facts["cores"] >= 1


# The GPU parsers run on text in nvidia-smi's documented formats: a fake, because this machine
# has no GPU (on a GPU machine the declaration tests above exercise them for real).
TOPO_8_NVSWITCH = "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" + "".join(
    f"GPU{i}\t" + "\t".join(" X " if i == j else "NV18" for j in range(3)) + "\tPXB\t0-55\t0\t\tN/A\n" for i in range(3)
) + "NIC0\tPXB\tPXB\tPXB\t X \n"
TOPO_1_GPU = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n"


def test_topology_counts_the_nvlink_domain_of_gpu0():
    domain = parse_topology(TOPO_8_NVSWITCH)
    assert (domain.gpus, domain.link) == (3, "NV18")


def test_a_single_gpu_is_a_domain_of_one_over_pcie():
    domain = parse_topology(TOPO_1_GPU)
    assert (domain.gpus, domain.link) == (1, "PCIe")


def test_gpu_query_rows_and_generation():
    rows = parse_gpu_query("NVIDIA H200, 143771, 570.86.15, 9.0\nNVIDIA H200, 143771, 570.86.15, 9.0\n")
    assert len(rows) == 2 and rows[0]["memory_gib"] == 140.4
    assert gpu_generation(rows[0]["name"], rows[0]["compute_cap"]) == "Hopper (NVIDIA H200, sm_90)"


def test_gpu_query_without_compute_capability_or_memory_still_lists_the_gpu():
    (row,) = parse_gpu_query("NVIDIA GB200, [N/A], 575.51.03\n")
    assert row["memory_gib"] is None and row["compute_cap"] is None
    assert gpu_generation(row["name"], row["compute_cap"]) == "Blackwell (NVIDIA GB200)"
