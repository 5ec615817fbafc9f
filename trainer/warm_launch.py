"""torchrun for the embedded trainer with torch imported once per node instead of once per rank.

`python -m trainops.trainer.warm_launch <torchrun options> -m trainops.trainer.train --run-dir RUN`
parses torchrun's own options, imports the trainer (torch, the model, FSDP: about 2.7 s of CPU), then
lets torch's elastic agent fork each rank from this process (start method "fork") and call the
trainer's `main` in it. A rank then starts in milliseconds; rendezvous, restarts, signals and exit
codes are torchrun's, as before. CUDA is not touched before the fork (importing torch does not
initialise it), so forked ranks can use NCCL.

A forked rank never execs, so its /proc/PID/environ shows this launcher's environment, not its RANK.
Each rank therefore writes its rank into its kernel name (comm, `RANK_NAME`), which
tools/schedulers/processes.rank_processes reads for processes of this launcher."""
from __future__ import annotations

import ctypes
import os
import sys
import uuid

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args

from trainops.trainer import train
from trainops.trainer.launch import RANK_NAME, WARM_LAUNCHER
from trainops.trainer.rank_exits import ExitWatch

_PR_SET_NAME = 15


def _name_rank(rank: str) -> None:
    name = RANK_NAME.format(rank=rank).encode()[:15]
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _rank(*argv: str) -> None:
    """One forked rank: the trainer's main, leaving with its exit code (SystemExit is how a
    multiprocessing child sets its exit code; a return value would read as success)."""
    _name_rank(os.environ["RANK"])
    code = train.main(list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        raise SystemExit(code)


@record
def main(argv: list[str] | None = None) -> None:
    """torchrun's `run` with the trainer's main as a forked function entry point (torchrun exits 1
    when a rank fails; so does this)."""
    args = parse_args(argv if argv is not None else sys.argv[1:])
    if args.training_script != train.__name__ or not args.module:
        raise SystemExit(f"{WARM_LAUNCHER} runs only '-m {train.__name__}', not {args.training_script!r}")
    overrides = {"start_method": "fork"}
    if args.standalone:  # as torchrun does: a rendezvous of one node on a free local port
        overrides.update(rdzv_backend="c10d", rdzv_endpoint="localhost:0", rdzv_id=str(uuid.uuid4()))
    vars(args).update(overrides)
    config, _, _ = config_from_args(args)
    watch = ExitWatch()
    watch.start()
    try:
        elastic_launch(config=config, entrypoint=_rank)(*args.training_script_args)
    except ChildFailedError as failed:  # torch names the first failure its poll found, not the first to end
        raise watch.first_failures(failed) from None
    finally:
        watch.stop()


if __name__ == "__main__":
    main()
