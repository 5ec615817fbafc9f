"""The peer a user would otherwise pick: DeepSpeed ZeRO training Hugging Face's LlamaForCausalLM
of the same shape, math and batch as the trainer run it is compared with. Run under torchrun
(gloo on the CPU); rank 0 writes the per-step times as JSON.

    torchrun --nproc-per-node 2 -m trainops.benchmarks.peer_deepspeed --zero 2 --out T.json
"""
from __future__ import annotations

import argparse
import json
import os
import time

# The shape of the comparison (issue 17): dim 256, 4 layers, 8 query / 4 KV heads, SwiGLU 688,
# byte vocabulary, 256 tokens, micro-batch 4 per rank, fp32, AdamW, clipping 1.0.
SHAPE = {"dim": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden_dim": 688, "vocab_size": 256}
SEQ_LEN, MICRO_BATCH, LR, BETAS, WEIGHT_DECAY, CLIP = 256, 4, 3e-3, (0.9, 0.95), 0.1, 1.0


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=SHAPE["dim"], num_hidden_layers=SHAPE["n_layers"],
                         num_attention_heads=SHAPE["n_heads"], num_key_value_heads=SHAPE["n_kv_heads"],
                         intermediate_size=SHAPE["ffn_hidden_dim"], vocab_size=SHAPE["vocab_size"],
                         max_position_embeddings=SEQ_LEN, tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zero", type=int, choices=(1, 2), default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (DeepSpeed's engine.compile)")
    parser.add_argument("--profile-steps", default=None, metavar="FIRST,COUNT",
                        help="run these steps under torch.profiler (benchmarks/step_profile.py)")
    parser.add_argument("--trace", default=None, help="where rank 0 writes the Chrome trace")
    args = parser.parse_args()

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    import torch.nn.functional as F

    from trainops.tools.frameworks.deepspeed_train import skip_inference_kernel_build

    skip_inference_kernel_build()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = hf_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
              "gradient_clipping": CLIP, "zero_optimization": {"stage": args.zero},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    if args.compile:
        engine.compile()
    generator = torch.Generator().manual_seed(rank)

    def one_step() -> float:
        started = time.perf_counter()
        tokens = torch.randint(0, SHAPE["vocab_size"], (MICRO_BATCH, SEQ_LEN + 1), generator=generator)
        logits = engine(input_ids=tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        engine.backward(loss)
        engine.step()
        torch.distributed.all_reduce(loss.detach(), op=torch.distributed.ReduceOp.AVG)
        loss.item()
        return time.perf_counter() - started

    first, count = (int(x) for x in args.profile_steps.split(",")) if args.profile_steps else (0, 0)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    step_times = []
    for step in range(1, args.steps + 1):
        if step == first:
            profiler.start()
        with torch.profiler.record_function(f"train_step#{step}"):  # the ranges step_profile.py splits on
            step_times.append(one_step())
        if step == first + count - 1 and count:
            profiler.stop()
            if rank == 0 and args.trace:
                profiler.export_chrome_trace(args.trace)
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"step_time_s": step_times, "deepspeed": deepspeed.__version__}, fh)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
