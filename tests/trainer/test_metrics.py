"""Per-step metrics: FLOPs convention checked independently, labelled peak, outputs per rank."""
from __future__ import annotations

import json
import socket
import urllib.request

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from trainops.trainer.config import MetricsConfig
from trainops.trainer.metrics import RECORD_FIELDS, MetricsLogger, device_peak_tflops, flops_per_token
from trainops.trainer.model import Transformer
from trainops.trainer.model_args import preset


@pytest.mark.parametrize("tie_embeddings", [False, True])
def test_flops_per_token_matches_an_independent_count_of_forward_and_backward(tie_embeddings):
    """FlopCounterMode counts every matmul of one forward+backward (SDPA's math backend makes
    attention visible to it as bmm). The convention counts 6 FLOPs per parameter, norm weights
    included, while the counter sees no FLOPs in elementwise norms: the only difference must be
    6 x (norm parameters)."""
    args = preset("tiny", tie_embeddings=tie_embeddings)
    model = Transformer(args)
    model.init_weights(seed=0)
    batch, seq_len = 2, 64
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, args.vocab_size, (batch, seq_len))).sum().backward()
    counted_per_token = counter.get_total_flops() / (batch * seq_len)
    norm_params = args.dim * (2 * args.n_layers + 1)
    assert counted_per_token == flops_per_token(args, seq_len) - 6 * norm_params


def test_cpu_peak_is_measured_labelled_and_cached(workspace):
    peak, source = device_peak_tflops(torch.device("cpu"), "fp32")
    cache = json.loads((workspace / "cache" / "peak_flops.json").read_text())
    assert source == "measured-gemm" and peak > 0 and peak in cache.values()
    assert device_peak_tflops(torch.device("cpu"), "fp32") == (peak, source)


def _logger(run_dir, rank=0, **cfg) -> MetricsLogger:
    return MetricsLogger(MetricsConfig(**cfg), run_dir, rank, run_id="r1", total_steps=10,
                         peak_tflops=2.0, peak_source="measured-gemm")


def _record(logger: MetricsLogger, step: int = 1) -> dict:
    return logger.record(step=step, loss=2.5, grad_norm=0.5, step_time_s=0.5, tokens=1000,
                         flops_per_token=1_000_000, peak_mem_gib=0.25, data_wait_s=0.01)


def test_a_step_record_has_the_contract_fields_and_the_mfu_arithmetic(tmp_path):
    record = _record(_logger(tmp_path))
    written = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert set(RECORD_FIELDS) | {"peak_source"} == set(written)
    # 1000 tokens in 0.5 s x 1e6 FLOPs/token = 2e9 FLOP/s = 0.002 TFLOP/s of a 2 TFLOP/s peak
    assert record["tokens_per_s"] == 2000 and record["tflops"] == pytest.approx(0.002)
    assert record["mfu_pct"] == pytest.approx(0.1)


def test_each_step_rewrites_the_rank_heartbeat(tmp_path):
    logger = _logger(tmp_path, rank=1)
    _record(logger, step=3)
    beat = json.loads((tmp_path / "heartbeat" / "rank1.json").read_text())
    assert beat["step"] == 3 and {"time", "pid"} <= set(beat)


def test_rank_zero_prints_one_readable_line_with_mfu(tmp_path, capsys):
    _record(_logger(tmp_path, rank=0))
    _record(_logger(tmp_path, rank=1))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "mfu 0.10% (measured-gemm)" in lines[0]


def test_the_prometheus_exporter_serves_the_record_and_registers_itself(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _record(_logger(tmp_path, rank=0, prometheus_port_base=port), step=4)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'trainops_loss{rank="0",run="r1"} 2.5' in body
    assert 'trainops_step{rank="0",run="r1"} 4.0' in body
    exporters = json.loads((tmp_path / "exporters.json").read_text())
    assert exporters["0"].endswith(f":{port}")
