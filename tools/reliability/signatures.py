"""Failure signatures, declared as data: what a line says about why a job ended, taken from the
texts their sources print (NVIDIA's Xid catalog and its resolution buckets, the CUDA runtime's
errors, NCCL's and PyTorch's error texts, Slurm's job states and slurmstepd's lines, the Linux
OOM killer, errno). Each entry: what it matches, its cause and sub-cause, how specific it is, what
it implies, the next step (what to change), and its source; whether a requeue can help is its
cause class's (tools/reliability/next_steps.py), never an entry's. Adding a signature is one
entry; `match_lines` (signature_match.py) ranks every hit by specificity, never first hit.

Specificity: 4 names the cause itself and outranks the symptoms it produces (an ECC error over
the watchdog abort it caused, a NCCL socket error over the timeout, /dev/shm full over a full
disk, the scheduler's own line over the SIGTERM it sent); 3 a specific error text; 2 a class
hint (a device-side assert, a bare bus error); 1 generic (a teardown `Connection refused`, a
frame name, a cancel line naming no reason). The classifier trusts 3 and above; a hint (2) names a cause
at low confidence, and below that it says what it saw."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    name: str
    pattern: re.Pattern
    cause: str
    sub_cause: str
    specificity: int
    implies: str
    next_step: str
    source: str
    settles: bool = True
    """False where the source's own text names a family of causes (NCCL's ncclSystemError: 'a system call,
    e.g. socket or malloc, or an external library call failed'): never 'high' on its own."""
    job_writable: bool = False
    """True where the line is one the scheduler prints into the job's own output, which the job could print as
    well: on that text alone never 'high' (the scheduler's own job state decides it)."""
    twice: bool = False
    """True where one line says nothing and the same line printed twice is the evidence (a rank announcing
    itself: two processes announcing the same global rank); the second copy is the hit."""
    last_of: re.Pattern | None = None
    """Where set, only the log's last line of this kind can hit: a progress bar passes every elapsed time on its
    way, and only where it stood when the job ended says anything."""
    quote_from: re.Pattern | None = None
    """Where set, the quote is the nearest line of this kind at or above the hit (a few lines up): the hit
    carries an error on (NCCL's `file.cc:N -> 6` trace) and the line that started it names the reason."""


def _sig(name: str, pattern: str, cause: str, sub_cause: str, specificity: int, implies: str, next_step: str,
         source: str, settles: bool = True, exact_case: bool = False, twice: bool = False,
         last_of: str | None = None, quote_from: str | None = None) -> Signature:
    return Signature(name, re.compile(pattern, 0 if exact_case else re.I), cause, sub_cause, specificity, implies,
                     next_step, source, settles, job_writable=exact_case, twice=twice,
                     last_of=re.compile(last_of) if last_of else None,
                     quote_from=re.compile(quote_from) if quote_from else None)


def _slurm_end(due_to: str) -> str:
    """slurmstepd's own line for a job or step the scheduler ended, exactly as it prints it (capitals)."""
    return rf"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+{due_to} \*\*\*"


_CHECK_NODE = ("run trainops' known-answer check job on that node and read its kernel log (a job trainops submits "
               "there); drain it when the check agrees (the check's verdict, not this line, decides what runs next)")
_NCCL_TRACE = r"NCCL INFO \S+\.(?:cc|h|cu|cpp):\d+ -> "
"""NCCL's error trace: each function an error passes through prints 'file.cc:LINE -> N', N its ncclResult_t."""
_NCCL_WARN = r"NCCL WARN "
"""NCCL's WARN line: where an error starts, before its trace, naming the reason."""
_PROGRESS_BAR = r"\d+%\|[^\n]*\[\d+:\d\d(?::\d\d)?<"
_LOSS_SCALE_COLLAPSE = r"loss.?scale[^\n]*?\bto:?\s*(?:-\d|0(?:\.\d+)?\b|\d(?:\.\d+)?e-\d)"
"""A decrease to a scale below 1: its first line is the collapse, quoted as it is."""
_GRAD_OVERFLOW = (r"OVERFLOW! Rank \d+ Skipping step|Gradient overflow\.\s+Skipping step|"
                  r"overflow detected, setting loss scale to|Found NaN, decreased lg_loss_scale")
"""Routine overflow lines repeat as the scaler halves its scale; the last one says how far it fell before the
end, so a hit is quoted from it (last_of)."""
"""tqdm's progress line: '46%|####      | 31/67 [29:02<35:12, 58.67s/it]' (elapsed < remaining)."""
_FREE_PORT = ("launch with a free port (MASTER_PORT / --master_port, or torchrun's --rdzv-endpoint HOST:0 or "
              "--standalone, which pick one), and find what holds it on the node (ss -ltnp): another job there, or a "
              "process left over from an earlier run")
_PORT_SOURCE = ("PyTorch c10d socket.cpp: 'The server socket has failed to listen on any local network address', per "
                "address '... (errno: 98 - Address already in use)'; DistNetworkError '... name: EADDRINUSE'")
_XID = r"\bXid\b[^\n]*?\b(?:\d{4}:)?[0-9a-f]{2}:[0-9a-f]{2}(?:\.\d)?\)?:?\s*"  # "Xid (PCI:0000:3b:00): 79, ..."

SIGNATURES: tuple[Signature, ...] = (
    # --- GPU hardware: the GPU's own messages -------------------------------------------------
    _sig("cuda-ecc-uncorrectable", r"uncorrectable ECC error", "hardware", "ecc", 4,
         "the GPU's memory (HBM) reported an uncorrectable ECC error", _CHECK_NODE,
         "CUDA runtime cudaErrorECCUncorrectable; NVIDIA Xid catalog (48/94/95)"),
    _sig("xid-ecc-hbm", _XID + r"(48|63|64|92|94|95)\b", "hardware", "ecc", 4,
         "the Xid catalog's memory bucket: ECC / row remapping on the GPU's HBM", _CHECK_NODE,
         "NVIDIA Xid catalog: 48 DBE, 63/64 row remapping, 92 high SBE rate, 94/95 contained/uncontained ECC"),
    _sig("xid-off-bus", _XID + r"79\b|fallen off the bus", "hardware", "fallen-off-bus", 4,
         "the GPU fell off the bus (the Xid catalog: reset the GPU or the node)", _CHECK_NODE,
         "NVIDIA Xid catalog: 79 GPU has fallen off the bus"),
    _sig("xid-nvlink", _XID + r"74\b|NVLink[^\n]*(error|uncorrectable|fatal|down)|uncorrectable NVLink",
         "hardware", "nvlink", 4, "an NVLink error between GPUs of the node", _CHECK_NODE,
         "NVIDIA Xid catalog: 74 NVLink error; CUDA runtime cudaErrorNvlinkUncorrectable"),
    _sig("xid-gsp", _XID + r"(119|120|62|61)\b", "hardware", "gpu-firmware", 4,
         "the GPU's firmware (GSP / microcontroller) stopped answering", _CHECK_NODE,
         "NVIDIA Xid catalog: 61/62 internal microcontroller, 119/120 GSP"),
    _sig("xid-application", _XID + r"(13|31|43|45)\b", "software", "xid-application", 2,
         "an Xid the catalog puts in the application bucket (a bad kernel or memory access by the job)",
         "read the job's own error before suspecting the GPU; rerun with CUDA_LAUNCH_BLOCKING=1",
         "NVIDIA Xid catalog: 13/31/43/45 application bucket"),
    _sig("gpu-lost", r"GPU is lost|GPU [^\n]*has fallen off|Unable to determine the device handle for GPU|"
         r"cudaErrorDevicesUnavailable|CUDA_ERROR_DEVICE_UNAVAILABLE", "hardware", "gpu-lost", 4,
         "the GPU disappeared from the node", _CHECK_NODE, "nvidia-smi; CUDA runtime"),
    _sig("pcie-aer", r"PCIe Bus Error[^\n]*(Uncorrected|Fatal)|AER:[^\n]*Uncorrected", "hardware", "pcie", 4,
         "the PCIe link to a device reported an uncorrected error", _CHECK_NODE, "Linux PCIe AER"),
    _sig("ecc-any", r"\bECC error|ecc_errors|DCGM_FI_DEV_ECC", "hardware", "ecc", 3,
         "the GPU reported ECC errors", _CHECK_NODE, "CUDA runtime; DCGM"),
    # --- GPU memory --------------------------------------------------------------------------
    _sig("cuda-oom", r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|"
         r"cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|cuda[^\n]*\bout of memory|"
         r"out of memory[^\n]*\b(gpu|cuda|device)|RESOURCE_EXHAUSTED: OOM", "gpu-memory", "oom", 3,
         "the job asked the GPU for more memory than it had free",
         "lower the micro-batch (or sequence length), or add activation checkpointing / sharding, then resubmit "
         "with that change: the same job runs out of memory at the same point",
         "PyTorch CUDA caching allocator; CUDA runtime cudaErrorMemoryAllocation; cuBLAS; TensorFlow"),
    # --- host memory -------------------------------------------------------------------------
    _sig("shm-full", r"/dev/shm[^\n]*(No space|full|failed|error)|(No space|full|failed|error)[^\n]*/dev/shm|"
         r"unable to write to file </torch_|shared memory segment|insufficient shared memory|shm_open",
         "host-memory", "shm", 4, "the node's shared memory (/dev/shm) is too small for the job",
         "give the job more shared memory (a container's --shm-size / --ipc=host), or fewer DataLoader workers",
         "PyTorch DataLoader; NCCL shared-memory transport"),
    _sig("dataloader-bus-error", r"DataLoader worker[^\n]*(Bus error|bus error)|Bus error[^\n]*DataLoader",
         "host-memory", "shm", 4, "a DataLoader worker died of a bus error: shared memory ran out",
         "give the job more shared memory (--shm-size / --ipc=host), or fewer DataLoader workers",
         "PyTorch DataLoader's worker error text"),
    _sig("dataloader-killed", r"DataLoader worker \(pid[^\n]*killed by signal: Killed", "host-memory",
         "oom-kill-dataloader-worker", 4, "the kernel killed a DataLoader worker: host memory ran out",
         "fewer DataLoader workers or a smaller prefetch, or a node with more memory",
         "PyTorch DataLoader's worker error text"),
    _sig("oom-killer", r"Out of memory: Kill|oom-kill|oom_kill|Memory cgroup out of memory|"
         r"cgroup out-of-memory handler|OUT_OF_MEMORY|task \d+: Out Of Memory", "host-memory", "oom-kill", 4,
         "the kernel's OOM killer ended the job's processes: host memory ran out",
         "lower the job's host memory use (workers, caching, pinned buffers) or ask the scheduler for more memory",
         "Linux OOM killer; Slurm slurmstepd oom-kill / OUT_OF_MEMORY state, srun's 'task N: Out Of Memory'"),
    _sig("slurm-memory-limit", r"\b(?:Job|Step|JobId=|StepId=)\s?[\d.]+\w* exceeded (?:virtual )?memory limit "
         r"\(\d+ > \d+\)|Exceeded (?:job|step) memory limit(?! at some point)", "host-memory", "job-memory-limit", 4,
         "the scheduler killed the job for using more host memory than it asked for (its memory limit)",
         "ask the scheduler for more memory (--mem / --mem-per-cpu: the line gives the use and the limit), or lower "
         "the job's host memory use (DataLoader workers, caching, data held in RAM)",
         "Slurm jobacct_gather ('%ps exceeded memory limit (USED > LIMIT), being killed', also 'virtual memory'), "
         "slurmctld/slurmstepd's 'Exceeded job memory limit' notice"),
    _sig("slurm-memory-limit-reached", r"Exceeded (?:job|step) memory limit at some point", "host-memory",
         "job-memory-limit", 2, "the job's memory cgroup reached its limit at some point (page cache counts too: "
         "not a kill by itself)", "compare the job's peak memory (sacct -o MaxRSS,ReqMem) with what it asked for",
         "Slurm task/cgroup's 'Exceeded job/step memory limit at some point.' (memory.failcnt)"),
    _sig("host-alloc", r"\bMemoryError\b|std::bad_alloc|Cannot allocate memory|DefaultCPUAllocator: "
         r"(can't|not enough)|\[Errno 12\]", "host-memory", "host-oom", 3,
         "the job could not allocate host memory",
         "lower host memory use (the step that allocated: loading, saving, caching) or use a larger node",
         "Python MemoryError; C++ std::bad_alloc; errno ENOMEM; PyTorch CPU allocator"),
    _sig("bus-error", r"\bBus error\b", "host-memory", "shm", 2, "a bus error (often shared memory exhausted)",
         "check /dev/shm on the node and the job's shared-memory size", "POSIX SIGBUS"),
    _sig("killed", r"^\s*Killed\s*$|exit code 137|exitcode\s*:\s*-9\b|\b(?:ba|da|z)?sh: line \d+: +\d+ Killed\b",
         "host-memory", "killed", 2,
         "a training process was killed with SIGKILL and nothing in the log names who sent it (no scheduler end, "
         "no launcher stop): on a host the usual sender is the kernel's OOM killer, a suspicion until the node's "
         "kernel log shows it",
         "read the node's kernel log at that time (dmesg: 'Out of memory: Killed process PID'); if it is there, lower "
         "the job's host memory use (workers, caching, data held in RAM) or ask for more memory",
         "Linux: SIGKILL is what the OOM killer sends, and a shell reports it as 'Killed' (bash's 'line N: PID "
         "Killed'); torchrun reports a child's SIGKILL as 'failed (exitcode: -9)' / exit code 137 (128+9)"),
    # --- storage -----------------------------------------------------------------------------
    _sig("disk-full", r"No space left on|\[Errno 28\]|\berrno[ =:]*28\b|ENOSPC|Disk quota exceeded|\[Errno 122\]|"
         r"not enough space on the disk",
         "storage", "disk-full", 3, "the file system the job writes to is full",
         "free space (or raise the quota) where the job writes; the checkpoint written then may be truncated: "
         "resume from the previous good one in the journal", "errno ENOSPC / EDQUOT"),
    _sig("checkpoint-truncated", r"PytorchStreamReader failed|failed finding central directory|"
         r"unexpected EOF|Ran out of input|file might be corrupted|not a zip file|invalid load key",
         "storage", "truncated-checkpoint", 3, "a checkpoint file is truncated or unreadable",
         "resume from the previous good checkpoint in the journal, and find why the write was cut",
         "PyTorch serialization (zip container); pickle"),
    _sig("write-failed", r"PytorchStreamWriter failed|unexpected pos|file write failed|Input/output error|"
         r"\[Errno 5\]|Read-only file system|\[Errno 30\]", "storage", "write-failed", 3,
         "a write to storage failed", "check the file system the job writes to (space, health, mount)",
         "PyTorch serialization; errno EIO / EROFS"),
    _sig("write-open-failed", r"\bFile \S+ cannot be opened\b", "storage", "write-failed", 3,
         "the checkpoint writer could not open its file (a full disk or quota, a missing directory, no write "
         "permission, a read-only mount)",
         "check the file system the job writes checkpoints to: free space and quota (df), that the directory exists "
         "and is writable; the checkpoint was not written, so resume from the previous good one",
         "PyTorch serialization: PyTorchStreamWriter's 'File <name> cannot be opened.' (caffe2/serialize/"
         "inline_container.cc), raised by torch.save"),
    # --- configuration -----------------------------------------------------------------------
    _sig("state-dict-shape", r"size mismatch for|Error\(s\) in loading state_dict|Missing key\(s\) in state_dict|"
         r"Unexpected key\(s\) in state_dict|shape[^\n]*(does not match|mismatch)", "configuration",
         "shape-mismatch", 3, "the checkpoint's shapes do not fit the model this job built",
         "make the model's config match the checkpoint (the field the shapes name), or convert the checkpoint",
         "PyTorch load_state_dict error text"),
    _sig("vocab-index", r"srcIndex < srcSelectDimSize|index out of range in self|indexSelect", "configuration",
         "vocab-mismatch", 3, "a token or class id is larger than the embedding or output layer",
         "make the vocabulary / number of classes in the config match the data and tokenizer",
         "PyTorch embedding / index_select device-side assertion"),
    _sig("parallel-size", r"world.?size[^\n]*(mismatch|does not match|not match|!=|not equal)|"
         r"(divisible|divides)[^\n]*world.?size|world.?size[^\n]*divisible|"
         r"(tensor|pipeline|data)[_ ]model[_ ]parallel[_ ]size|dp[_ ]world[_ ]size|"
         r"not enough GPUs|invalid device ordinal|Duplicate GPU detected", "configuration", "parallel-size", 3,
         "the parallel layout does not fit the world size or the GPUs the job has",
         "set the parallel sizes so that their product divides the world size, or launch the world the checkpoint "
         "was saved with (or convert the checkpoint)", "PyTorch / Megatron / DeepSpeed layout checks; NCCL"),
    _sig("duplicate-global-rank", r"\bGLOBAL_RANK: \d+, MEMBER: \d+/\d+", "configuration", "parallel-size", 3,
         "two processes announced the same global rank: the launch started more copies of the world than the job "
         "expects (the scheduler's nodes / tasks per node do not match the job's num_nodes and devices)",
         "make the scheduler's nodes and tasks per node match the job's num_nodes and devices per node",
         "PyTorch Lightning's per-process DDP init line ('initializing ddp' / 'Initializing distributed')",
         settles=False, twice=True),
    _sig("not-divisible", r"(is not|must be|should be)[^\n]*(divisible|a multiple of)|not divisible by|"
         r"^\s*(?:\[\w+\]:\s*)?assert\s[^\n]*%[^\n]*==\s*0\b", "configuration", "not-divisible", 3,
         "a size in the config is not a multiple of what it must divide into",
         "change the named size (batch, heads, hidden) so that it divides evenly",
         "framework config checks; a Python traceback's source line of a failed `assert a % b == 0`"),
    _sig("shape-op", r"mat1 and mat2 shapes cannot be multiplied|The size of tensor a [^\n]*must match|"
         r"shape '\[[^\n]*is invalid for input of size|cannot reshape array of size \d+ into shape",
         "configuration", "shape-mismatch", 3,
         "two tensors' shapes disagree: a model dimension and the data or checkpoint differ",
         "make the named dimension agree in the config", "PyTorch shape errors; NumPy reshape"),
    _sig("rendezvous-listen-failed", r"server socket has failed to listen on any local network address",
         "configuration", "rendezvous-port", 4,
         "the rendezvous server (rank 0's c10d TCPStore) could not listen on its port on any address: the port is "
         "taken (most often), or not one it may bind", _FREE_PORT, _PORT_SOURCE),
    _sig("rendezvous-port-in-use", r"(?:c10d|TCPStore|socket\.cpp|rendezvous|MASTER_PORT|DistNetworkError|"
         r"torch\.distributed)[^\n]*(?:Address already in use|EADDRINUSE)", "configuration", "rendezvous-port", 3,
         "the rendezvous port is already in use on the node", _FREE_PORT, _PORT_SOURCE),
    _sig("address-in-use", r"Address already in use|EADDRINUSE|\[Errno 98\]", "configuration", "port-in-use", 2,
         "a port the job binds is already in use (by another job, or a process left over from an earlier run)",
         _FREE_PORT, "errno EADDRINUSE (98)"),
    _sig("device-assert", r"device-side assert triggered|Assertion `[^`]+` failed", "configuration",
         "device-assert", 2, "a device-side assertion failed (an index or value outside what the model accepts)",
         "rerun with CUDA_LAUNCH_BLOCKING=1 to find the assertion; check vocabulary and label ranges",
         "CUDA device-side assertions"),
    # --- numerics / data ---------------------------------------------------------------------
    _sig("loss-scale-min", r"(Minimum|min) loss scale reached|loss scale[^\n]*(minimum|already at)|"
         r"Current loss scale already at minimum", "data", "fp16-overflow", 4,
         "fp16 gradients overflowed at every loss scale down to the minimum",
         "switch to bf16, lower the learning rate, or clip gradients; find the step's data",
         "DeepSpeed / fairseq / apex dynamic loss scaler"),
    _sig("loss-scale-collapse", _LOSS_SCALE_COLLAPSE, "data",
         "fp16-overflow", 4, "the fp16 loss scaler went on halving its scale to below 1 (a negative log2 scale): the "
         "gradients overflow even unscaled, so the NaN/inf comes from the model's forward or weights (a divergence), "
         "not from the scaling", "switch to bf16 (or fp32) to find the first non-finite step, lower the learning "
         "rate or clip gradients, and resume from a checkpoint before the loss went NaN",
         "dynamic loss scalers' decrease lines: apex ('reducing loss scale to S'), DeepSpeed ('Attempted loss scale: "
         "S, reducing to S/2'), fairseq ('setting loss scale to: S'), guided/improved-diffusion fp16_util ('Found "
         "NaN, decreased lg_loss_scale to L', L = log2 of the scale); loss scaling starts at 2^16 or so"),
    _sig("nan-loss", r"\b(?:\w+_)?loss(?!_?scale)(?:_\w+)?\b['\"]?\s*[:=|]?\s*(nan|[+-]?inf)\b|"
         r"\bloss (is|became|was) (nan|[+-]?inf)|\b(nan|inf) loss\b|NaN or Inf found|FloatingPointError|"
         r"non-finite loss|Detected NaN|Tensor had (NaN|Inf) values|returned (nan|inf) values in its|"
         r"diverged with loss", "data", "nan-loss", 3,
         "the loss became NaN or inf", "lower the learning rate (and scale it with the batch), clip gradients, "
         "and replay the step's data to see whether it recurs",
         "framework NaN guards and loss lines: Keras/TF 'loss: nan', tf.debugging.check_numerics 'Tensor had NaN "
         "values', TF 'Model diverged with loss = NaN', detectron2 'Loss became infinite or NaN', torch autograd "
         "anomaly mode 'returned nan values in its 0th output', a logger's '<name>_loss: nan' or its table row "
         "('| loss | nan |', OpenAI's logger)"),
    _sig("grad-overflow", _GRAD_OVERFLOW, "data",
         "fp16-overflow", 2, "fp16 gradients overflowed and steps were skipped (routine once, a problem when it "
         "repeats down to the minimum scale)", "switch to bf16 or lower the learning rate if it repeats",
         "DeepSpeed loss_scaler; apex amp; fairseq FP16 optimizer; guided/improved-diffusion fp16_util",
         last_of=_GRAD_OVERFLOW),
    # --- network ------------------------------------------------------------------------------
    _sig("nccl-ib-completion", r"NET/IB[^\n]*Got completion|retry counter exceeded|IBV_WC_\w+_ERR", "network",
         "infiniband", 4, "an InfiniBand transfer completed with an error (status 12: the transport's retries ran "
         "out, the peer or the link did not answer; 13: the receiver was not ready; 4/10: a memory key the HCA "
         "refused)", "check the link between the two hosts the line names (ibstat, the switch port, the peer's own "
         "log: a peer process that died stops answering too); exclude the node until the link is healthy",
         "NCCL net_ib's 'NET/IB : Got completion from peer ADDR with error N' / 'with status=N' WARN; libibverbs "
         "ibv_wc_status (IBV_WC_RETRY_EXC_ERR 12 'transport retry counter exceeded', IBV_WC_RNR_RETRY_EXC_ERR 13)",
         settles=False),
    _sig("nccl-ib", r"NET/IB[^\n]*(error|port error|catastrophic|failed)|ibv_\w+ failed|IBV_EVENT_\w+|"
         r"local catastrophic error|NET/IB[^\n]*\b(port error|link down)\b|NET/IB : Got async event",
         "network", "infiniband", 4,
         "an InfiniBand port or HCA error on the node", "check the node's IB link (ibstat, the switch port); "
         "exclude the node until the link is healthy", "NCCL NET/IB; libibverbs"),
    _sig("gloo-interface-missing", r"enforce fail[^\n]*Unable to find address for|ifa != nullptr",
         "network", "socket-interface", 4, "gloo could not find the network interface it was told to use on this "
         "host (the name given, e.g. GLOO_SOCKET_IFNAME or Horovod's --network-interface, does not exist there)",
         "name an interface that exists on every host (ip -br addr on each): where hosts name their NICs "
         "differently, give each host its own name or rename them alike",
         "gloo transport/tcp device.cc: GLOO_ENFORCE(ifa != nullptr, 'Unable to find address for: ', iface)"),
    _sig("nccl-socket", r"NCCL_SOCKET_IFNAME|no socket interface found|NET/Socket[^\n]*(failed|error)|"
         r"Bootstrap[^\n]*(failed|error|no socket)|socketStartConnect|ncclSocket\w+ failed|bootstrap[^\n]*-> 2",
         "network", "socket-interface", 4, "NCCL could not open its sockets on the interface it chose",
         "set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the interface the nodes reach each other on",
         "NCCL bootstrap / socket transport"),
    _sig("nccl-system", r"ncclSystemError|ncclRemoteError|unhandled system error|remote process exited or "
         r"there was a network error", "network", "nccl-system-error", 3,
         "NCCL reported a system or network error (its own text: a system call, e.g. socket or malloc, or a remote "
         "peer failed; a family of causes, not one)",
         "rerun with NCCL_DEBUG=INFO to see the failing call; check interfaces, ports and firewall between nodes; "
         "where the nodes reach each other, the NCCL version (an upgrade fixed known system-error bugs)",
         "NCCL ncclResult_t: ncclSystemError, ncclRemoteError", settles=False),
    _sig("nccl-result-trace", _NCCL_TRACE + r"[26]\b|NCCL Error [26]\b", "network", "nccl-system-error", 3,
         "NCCL's error trace carries result 2 (ncclSystemError: a system call such as a socket failed) or 6 "
         "(ncclRemoteError: a peer failed or the network did)",
         "rerun with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET to see the failing call; check which interfaces "
         "NCCL uses (NCCL_SOCKET_IFNAME) and that the nodes reach each other on them",
         "NCCL's 'file.cc:LINE -> N' error trace, N an ncclResult_t (2 ncclSystemError, 6 ncclRemoteError)",
         settles=False, quote_from=_NCCL_WARN),
    _sig("conn-reset", r"Connection reset by peer|No route to host|Network is unreachable|ECONNRESET",
         "network", "connection-reset", 2, "a connection between ranks was reset or unreachable",
         "check which rank ended first (its error is the cause); then the link between the nodes",
         "errno ECONNRESET / EHOSTUNREACH / ENETUNREACH"),
    _sig("conn-refused", r"Connection refused|Broken pipe|Connection closed by peer", "network", "teardown", 1,
         "a peer's socket was gone (often the teardown after another rank failed)",
         "find the first rank that failed", "errno ECONNREFUSED / EPIPE"),
    # --- hung or slow peer -------------------------------------------------------------------
    _sig("collective-timeout", r"Watchdog caught collective operation timeout|ran for \d+ milli ?seconds before "
         r"timing out|collective operation timeout|barrier[^\n]*timed out|Timed out waiting[^\n]*(rank|barrier|"
         r"collective|clients|workers)|Socket Timeout|timed out after \d+|gloo[^\n]*(timed out|timeout)",
         "hung-peer", "collective-timeout", 3,
         "a collective timed out: the ranks that report it waited, one rank did not arrive",
         "find what the missing rank was doing (its stack: py-spy dump, or the flight recorder) and fix that code "
         "path (work only one rank does before a collective, e.g. preprocessing or an evaluation on rank 0), or "
         "raise the collective timeout; a requeue waits the same time again",
         "PyTorch ProcessGroupNCCL watchdog; c10d store; gloo"),
    _sig("store-wait", r"retrieving ncclUniqueId from \[\d+\] via c10d key-value store|store->get\([^)]*\) got "
         r"error|Timed out after \d+ seconds waiting for clients|Wait timeout after \d+ ?ms, keys:",
         "hung-peer", "store-wait", 3,
         "a rank waited in the c10d store for a key another rank writes (the NCCL id rank 0 publishes, a barrier's "
         "count): that rank had not reached the collective",
         "find what the awaited rank (rank 0 for the NCCL id) was doing: work only it does before its first "
         "collective (preprocessing, tokenizing, an evaluation); do that work before the process group or on every "
         "rank, or raise the timeout; a requeue waits the same time again",
         "PyTorch ProcessGroupNCCL ('retrieving ncclUniqueId from [0] via c10d key-value store ... store->get got "
         "error'); c10d TCPStore ('Wait timeout after Nms, keys:', 'Timed out after N seconds waiting for clients')"),
    _sig("progress-at-timeout", r"\d+%\|[^\n]*\[(?:09|10|29|30):[0-5]\d<", "hung-peer", "rank-busy-at-timeout", 2,
         "the job ended while its last progress bar (work a rank may be doing alone: preprocessing, tokenizing, an "
         "evaluation) had run about as long as PyTorch's default collective timeout (30 min; 10 min for NCCL in "
         "recent releases): the other ranks likely timed out waiting for this one",
         "do that work before the process group starts or on every rank (or cache its result), or raise the "
         "collective timeout (init_process_group's timeout, the trainer's ddp_timeout); a requeue waits the same "
         "time again",
         "tqdm's progress line ('[elapsed<remaining'); PyTorch init_process_group's timeout default (30 minutes; 10 "
         "minutes for NCCL in recent releases) and Hugging Face TrainingArguments.ddp_timeout (1800 s)",
         last_of=_PROGRESS_BAR),
    _sig("timeout-frame", r"checkTimeout|ProcessGroupNCCL[^\n]*(timeout|Timeout)|NCCL[^\n]*timeout",
         "hung-peer", "collective-timeout", 1, "a NCCL timeout frame (no message of its own)",
         "find the rank that did not arrive at the collective", "PyTorch ProcessGroupNCCL"),
    # --- scheduler ----------------------------------------------------------------------------
    # slurmstepd's exact lines only, case-sensitive (a job's own "preempted"/"requeued" is not the scheduler's);
    # being text in the job's output, they are capped below 'high' and decide no requeue (job_writable); a cancel
    # line naming no reason names no end at all (a scancel, a preemption and srun's teardown after a failed task all
    # print it): 'planned' without a DUE TO comes only from the scheduler's own job state (causes.scheduler_ended)
    _sig("slurm-preempted", _slurm_end(" DUE TO PREEMPTION"), "planned", "preemption",
         4, "the scheduler preempted the job", "requeue from the last good checkpoint (the job did nothing wrong)",
         "Slurm job state PREEMPTED; slurmstepd", exact_case=True),
    _sig("slurm-time-limit", _slurm_end(" DUE TO TIME LIMIT"), "planned",
         "time-limit", 4, "the job reached its time limit", "requeue from the last good checkpoint, with a longer "
         "limit or more frequent checkpoints", "Slurm job state TIMEOUT; slurmstepd", exact_case=True),
    _sig("slurm-requeued", _slurm_end(" DUE TO JOB REQUEUE"), "planned", "requeue", 3,
         "the scheduler requeued the job", "nothing to fix: the requeued job resumes from its last checkpoint",
         "Slurm requeue; slurmstepd", exact_case=True),
    # submitit, the launcher inside the job, logs the signal it caught and reads it as a preemption or its time
    # limit, then requeues the job itself: the job's own words, so capped below 'high' and deciding no requeue
    _sig("submitit-preempted", r"Caught signal \w+ on \S+: this job is preempted", "planned", "preemption", 3,
         "the job's submitit handler caught the scheduler's preemption signal", "requeue from the last good "
         "checkpoint (submitit requeues the job itself once it has checkpointed); confirm the preemption in the "
         "scheduler's accounting", "submitit JobEnvironment.checkpoint_and_try_requeue: 'Caught signal S on HOST: "
         "this job is preempted.'", exact_case=True),
    _sig("submitit-timed-out", r"Caught signal \w+ on \S+: this job is timed-out", "planned", "time-limit", 3,
         "the job's submitit handler caught the signal of its time limit", "requeue from the last good checkpoint "
         "with a longer limit or more frequent checkpoints (submitit requeues it itself while its timeout budget "
         "lasts)", "submitit JobEnvironment.checkpoint_and_try_requeue: 'Caught signal S on HOST: this job is "
         "timed-out.'", exact_case=True),
    _sig("slurm-node-fail", _slurm_end(" DUE TO NODE FAILURE"), "hardware", "node-failure", 4,
         "the scheduler lost the node under the job", _CHECK_NODE, "Slurm job state NODE_FAIL; slurmstepd",
         exact_case=True),
    _sig("slurm-cancelled", _slurm_end(""), "unclassified", "step-ended", 1,
         "the scheduler ended the step and the line names no reason: a user's scancel, a preemption, or srun tearing "
         "the step down after one task failed all print it; only the scheduler's job state (sacct State, Reason) "
         "says which", "read the job's state and reason from the scheduler's accounting (sacct -j JOB -o "
         "State,Reason,ExitCode) and the first task that failed", "Slurm slurmstepd's step end line",
         exact_case=True),
    # --- software ----------------------------------------------------------------------------
    _sig("nccl-argcheck", r"NCCL WARN \w+ : invalid \w+", "software", "nccl-invalid-usage", 3,
         "NCCL's argument check rejected the call it was given: the calling framework's code and this NCCL version "
         "disagree, not the network or the GPU",
         "use the framework and NCCL versions released together (or the framework's fix for that call)",
         "NCCL's argument checks (argcheck.cc: '<op> : invalid root/type/redop/count'), result 4 ncclInvalidArgument "
         "('a programming error in the application')"),
    _sig("nccl-invalid-usage", r"ncclInvalidArgument|ncclInvalidUsage|NCCL Error [45]\b|"
         r"NCCL error[^\n]*invalid (argument|usage)|" + _NCCL_TRACE + r"[45]\b", "software", "nccl-invalid-usage", 2,
         "NCCL rejected a call as invalid (its result code names the family; the WARN or 'Last error' line beside "
         "it names the reason, e.g. two ranks on one GPU)",
         "read NCCL's WARN / 'Last error' line (rerun with NCCL_DEBUG=WARN) for what it rejected",
         "NCCL ncclResult_t 4 ncclInvalidArgument / 5 ncclInvalidUsage ('a programming error in the application')",
         quote_from=_NCCL_WARN),
    _sig("collective-mismatch", r"Detected mismatch between collectives on ranks|Collectives differ in the "
         r"following aspects|Detected at least one rank that exhausted inputs|Rank \d+ exhausted all inputs",
         "software", "collective-desync", 4,
         "the ranks called different collectives (or one ran out of inputs while the others went on): the code takes a "
         "rank-dependent path, e.g. ranks given different numbers of batches, or a collective in a branch only some "
         "ranks take", "give every rank the same number of batches (a DistributedSampler, drop_last, or DDP's join() "
         "for uneven inputs) and keep collectives out of rank-dependent branches; a requeue repeats it",
         "PyTorch c10d's collective fingerprint check (TORCH_DISTRIBUTED_DEBUG=DETAIL: 'Detected mismatch between "
         "collectives on ranks'); torch.distributed.algorithms.Join ('Detected at least one rank that exhausted "
         "inputs')"),
    _sig("no-kernel-image", r"no kernel image is available|not compatible with the current PyTorch installation|"
         r"sm_\d+ is not compatible|unsupported gpu architecture", "software", "cuda-arch", 3,
         "the installed framework has no kernels for this GPU's architecture",
         "install a build compiled for this GPU (its CUDA arch)",
         "CUDA runtime cudaErrorNoKernelImageForDevice"),
    _sig("import-api", r"ModuleNotFoundError|ImportError|got an unexpected keyword argument|has no attribute|"
         r"can't set attribute|takes \d+ positional argument", "software", "dependency-api", 2,
         "the code and an installed library disagree (a missing module or a changed API)",
         "pin the library version the code was written for, or update the code", "Python"),
    _sig("no-destroy-pg", r"destroy_process_group\(\) was not called|process group has NOT been destroyed",
         "software", "teardown-missing-destroy-process-group", 2,
         "the program exited without destroying its process group", "call destroy_process_group() before exit",
         "PyTorch ProcessGroupNCCL destructor warning"),
    _sig("exception", r"^\s*(?:\S+:\s*)?[A-Za-z_][\w.]*(Error|Exception)\b:", "software", "exception", 1,
         "a Python exception", "read the exception and the code path it names", "Python"),
    _sig("traceback", r"Traceback \(most recent call last\)|Fatal Python error", "software", "traceback", 0,
         "a traceback header (it names nothing)", "read the line the traceback ends with", "Python"),
)

FRAMEWORKS: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(pat, re.I)) for name, pat in (
    ("the trainops trainer", r"trainops\.trainer|trainops/trainer"),
    ("a DeepSpeed job", r"deepspeed"),
    ("a Megatron job", r"megatron"),
    ("a Lightning job", r"lightning"),
    ("an Accelerate job", r"accelerate"),
    ("a Hugging Face Trainer job", r"transformers/trainer|transformers\.trainer"),
    ("a fairseq job", r"fairseq"),
    ("a Detectron job", r"detectron"),
    ("a submitit job", r"submitit"),
    ("a torchrun job", r"torch\.distributed\.elastic|torchrun|torch\.distributed\.run"),
))
"""Markers of the framework that printed a log, first match wins (the most specific first)."""
