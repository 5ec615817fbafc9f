"""The known-answer hardware check a suspected silent data corruption sets off, run as a job on
every node of the partition (fleet-wide) and on the suspect beside a known-good node (co-located).

Each rank multiplies two integer-valued float32 matrices whose exact product is known (computed
in int64), then all-reduces a known vector with its peers: a wrong element or a wrong sum is a
failing node. Each rank prints one result line (RESULT_MARK, then its JSON) to its standard output,
which the scheduler collects into the check job's own log: the verdict is read from there
(skills/sdc.py), never from a file in a folder any job can write. On this project's sandbox the
defective chip is emulated: a host the bit-flip fault marked (trainer.faults.mark_host_defective)
gets one flipped exponent bit in its product, as a faulty ALU would; nothing else differs.

    torchrun ... -m trainops.tools.reliability.sdc_check
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

from pydantic import BaseModel

KNOWN_ANSWER_FAILED = "sdc_check: known-answer check failed"
"""The line a failing check prints for a person to read; in a job's output it convicts nothing
(tools/reliability/causes.py quotes it): any job can print it."""
RESULT_MARK = "sdc_check result: "
GEMM_N = 256


class NodeResult(BaseModel):
    rank: int
    host: str
    gemm_ok: bool
    gemm_wrong_elements: int
    collective_ok: bool
    emulated_defect: bool

    @property
    def ok(self) -> bool:
        return self.gemm_ok and self.collective_ok


def results_in(log_text: str) -> list[NodeResult]:
    """The ranks' result lines in a check job's log, as the scheduler collected it (a torn or garbled
    line is skipped: a rank that printed none failed)."""
    results = []
    for line in log_text.splitlines():
        if RESULT_MARK not in line:
            continue
        try:
            results.append(NodeResult.model_validate_json(line.split(RESULT_MARK, 1)[1]))
        except ValueError:
            continue
    return results


def _gemm(defective: bool) -> int:
    """Wrong elements of the known-answer product on this host."""
    import torch

    from trainops.trainer.faults import exponent_msb, flip_bit

    a = (torch.arange(GEMM_N * GEMM_N, dtype=torch.int64).reshape(GEMM_N, GEMM_N) % 7) - 3
    b = (torch.arange(GEMM_N * GEMM_N, dtype=torch.int64).reshape(GEMM_N, GEMM_N).T % 5) - 2
    expected = a @ b
    product = a.to(torch.float32) @ b.to(torch.float32)
    if defective:
        flip_bit(product, product.numel() // 2, exponent_msb(product.dtype))
    return int((product.to(torch.float64) != expected.to(torch.float64)).sum().item())  # inf and NaN differ too


def _collective(rank: int, world: int) -> bool:
    import torch
    import torch.distributed as dist

    value = torch.full((1024,), float(rank + 1))
    dist.all_reduce(value)
    return bool((value == world * (world + 1) / 2).all().item())


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    from trainops.trainer.faults import defect_marker

    argparse.ArgumentParser(prog="sdc_check", description=__doc__).parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    host = socket.gethostname()
    defective = defect_marker(host).is_file()
    wrong = _gemm(defective)
    if world > 1:
        dist.init_process_group("gloo")
    collective_ok = _collective(rank, world) if world > 1 else True
    result = NodeResult(rank=rank, host=host, gemm_ok=wrong == 0, gemm_wrong_elements=wrong,
                        collective_ok=collective_ok, emulated_defect=defective)
    print(RESULT_MARK + result.model_dump_json(), flush=True)  # one write: a whole line in the job's log
    if not result.ok:
        print(f"{KNOWN_ANSWER_FAILED} on {host} (rank {rank}): GEMM {wrong} wrong element(s), collective "
              f"{'ok' if collective_ok else 'wrong'}", file=sys.stderr, flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
