"""Log parsers against step lines in each framework's real format; MFU is labelled by where it came from."""
from __future__ import annotations

import pytest

from trainops.tools.calls import call
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import ParseContext, ingest_log

# torchtitan MetricsProcessor.log (colour codes included, as it writes them to a terminal)
TITAN = ("[titan] 2025-05-01 10:00:00,000 - root - INFO - \x1b[31mstep: 10  \x1b[32mloss:  7.8312  "
         "\x1b[38;2;180;60;0mgrad_norm:  1.2345  \x1b[36mmemory: 42.30GiB(44.52%)  \x1b[34mtps: 1,234  "
         "\x1b[36mtflops: 71.45  \x1b[35mmfu: 7.22%\x1b[39m")
TITAN_OLD = "step: 10  loss:  7.8312  memory: 12.34GiB(15.60%)  wps: 1,234  mfu: 12.34%"
TITAN_VALIDATE = ("\x1b[33mvalidate step: 10  \x1b[32mloss:  7.9000  \x1b[36mmemory: 42.30GiB(44.52%)  \x1b[34mtps: "
                  "1,100\x1b[39m")
# Megatron-LM training_log: with --log-throughput, without it, and Megatron-DeepSpeed's variant
MEGATRON = (" [2026-05-29 03:52:45] iteration      300/     300 | consumed samples:       307200 | consumed tokens: "
            "1.258B | elapsed time per iteration (ms): 131064.1 | eta: 0:00:00 | tokens/sec/gpu: 8000.5 | throughput "
            "per GPU (TFLOP/s/GPU): 412.3 | learning rate: 1.100000E-05 | global batch size:  1024 | lm loss: "
            "1.504590E+00 | loss scale: 1.0 | grad norm: 0.623 | number of skipped iterations:   0 | number of nan "
            "iterations:   0 |")
MEGATRON_BARE = (" [2025-10-06 03:27:07] iteration       10/      10 | consumed samples:         5120 | elapsed time "
                 "per iteration (ms): 4647.8 | learning rate: 1.500000E-06 | global batch size:   512 | lm loss: "
                 "9.763827E+00 | loss scale: 1.0 | grad norm: 33.055 | number of skipped iterations:   0 | number of "
                 "nan iterations:   0 |")
MEGATRON_DS = (" iteration        5/      10 | consumed samples:         7680 | consumed tokens:     15728640 | "
               "elapsed time per iteration (ms): 344656.1 | learning rate: 2.270E-05 | global batch size:  1536 | lm "
               "loss: 1.100078E+01 | loss scale: 4294967296.0 | grad norm: 0.000 | actual seqlen:  2048 | number of "
               "skipped iterations:   0 | number of nan iterations:   0 | samples per second: 4.457 | tokens per gpu "
               "per second (tgs): 142.612 | TFLOPs: 153.38 |")
TRAINOPS = ("step     4/6  loss 5.9963  grad_norm 0.553  step_time 166ms  tok/s 1,547  tflops 0.008  mfu 8.02% "
            "(measured-gemm)  mem 0.42GiB  data_wait 0.3ms")
DS_TIMER = ("epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=35.2, CurrSamplesPerSec=36.1, "
            "MemAllocated=1.2GB, MaxMemAllocated=1.5GB")
H100 = ParseContext(flops_per_token=6e9, peak_tflops=989.0, seq_len=4096, world_size=64)


def test_torchtitan_line_keeps_its_own_mfu():
    record = get_adapter("torchtitan").parse_log_line(TITAN)
    assert (record.step, record.loss, record.tokens_per_s, record.tflops, record.mfu_pct) == (10, 7.8312, 1234.0, 71.45,
                                                                                              7.22)
    assert record.mfu_source == "framework"


def test_torchtitan_older_wps_line_parses():
    record = get_adapter("torchtitan").parse_log_line(TITAN_OLD)
    assert (record.step, record.tokens_per_s, record.mfu_pct) == (10, 1234.0, 12.34)


def test_torchtitan_validation_line_is_not_a_training_step():
    assert get_adapter("torchtitan").parse_log_line(TITAN_VALIDATE) is None


def test_megatron_tflops_become_mfu_against_trainops_peak():
    record = get_adapter("megatron").parse_log_line(MEGATRON, H100)
    assert (record.step, record.loss, record.step_time_s, record.tokens_per_s, record.tflops) == (
        300, 1.50459, 131.0641, 8000.5, 412.3)
    assert record.mfu_pct == pytest.approx(100 * 412.3 / 989.0)
    assert record.mfu_source == "trainops-from-tflops"


def test_megatron_without_throughput_uses_trainops_flops_convention():
    record = get_adapter("megatron").parse_log_line(MEGATRON_BARE, H100)
    tokens_per_s = 512 * 4096 / 4.6478 / 64
    assert record.tokens_per_s == pytest.approx(tokens_per_s)
    assert record.mfu_pct == pytest.approx(100 * tokens_per_s * 6e9 / 1e12 / 989.0)
    assert record.mfu_source == "trainops-flops-convention"


def test_megatron_without_context_reports_no_mfu_rather_than_guessing():
    record = get_adapter("megatron").parse_log_line(MEGATRON_BARE)
    assert (record.loss, record.mfu_pct, record.mfu_source) == (9.763827, None, "none")


def test_megatron_deepspeed_variant_parses_tflops_and_tgs():
    record = get_adapter("megatron").parse_log_line(MEGATRON_DS)
    assert (record.step, record.tflops, record.tokens_per_s, record.loss) == (5, 153.38, 142.612, 11.00078)


def test_trainops_and_deepspeed_script_share_the_step_line():
    for name in ("trainops", "deepspeed"):
        record = get_adapter(name).parse_log_line(TRAINOPS)
        assert (record.step, record.loss, record.step_time_s, record.tokens_per_s, record.mfu_pct) == (4, 5.9963, 0.166,
                                                                                                       1547.0, 8.02)


def test_deepspeed_throughput_timer_line_gets_trainops_mfu():
    ctx = ParseContext(flops_per_token=1e6, peak_tflops=0.1, seq_len=64, world_size=2)
    record = get_adapter("deepspeed").parse_log_line(DS_TIMER, ctx)
    assert record.step == 10 and record.tokens_per_s == pytest.approx(36.1 * 64 / 2)
    assert record.mfu_source == "trainops-flops-convention"


@pytest.mark.parametrize("name", ["trainops", "deepspeed", "torchtitan", "megatron"])
def test_other_lines_are_not_steps(name):
    assert get_adapter(name).parse_log_line("[rank0]: Loading checkpoint from /ckpt/step-100") is None


def test_a_job_log_becomes_metrics_records_that_summarize_run_reads(workspace):
    run_dir = workspace / "runs" / "titan"  # tools read only inside the workspace
    run_dir.mkdir(parents=True)
    log = "\n".join(["[titan] loading model", TITAN.replace("step: 10", "step: 1"), TITAN_VALIDATE,
                     TITAN.replace("step: 10", "step: 2").replace("7.8312", "7.5000")])
    assert ingest_log(get_adapter("torchtitan"), log, run_dir) == 2
    summary = call("summarize_run", {"run": str(run_dir), "skip_steps": 0})
    assert (summary.steps_measured, summary.final_loss, summary.mfu_pct_median) == (2, 7.5, 7.22)
    assert summary.step_time_median_s is None  # torchtitan prints no step time: absent, not zero
