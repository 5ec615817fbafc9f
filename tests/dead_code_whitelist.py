"""What vulture cannot see is alive, each with the reason (read by tests/test_dead_code.py).

A name here is alive wherever it appears, so an entry stays narrow: an entry point something
outside our code calls (a framework, a library's interface, a person at a prompt), never code
that is merely unused. Model fields, names the report templates read, SKILL.md steps' impls and
names the tests use are found by the test itself and are not listed.
"""

ENTRY_DECORATORS: dict[str, str] = {
    "@*.command": "typer registers the command; the CLI calls it",
    "@*.callback": "typer runs the group's callback before its commands",
    "@field_validator": "pydantic runs it on validation",
    "@model_validator": "pydantic runs it on validation",
}

ALIVE: dict[str, str] = {
    "model_config": "pydantic reads a model's configuration",
    "forward": "torch.nn.Module.__call__ runs it",
    "human_approval": "a LangGraph node: agents/graph.py build_graph adds the nodes by name",
    "report_check": "a LangGraph node: agents/graph.py build_graph adds the nodes by name",
    "_llm_type": "LangChain's BaseChatModel interface (agents/policy.py OfflinePolicy)",
    "_generate": "LangChain's BaseChatModel interface (agents/policy.py OfflinePolicy)",
    "run_manager": "LangChain passes it to _generate by keyword",
    "tool_choice": "LangChain callers pass it to bind_tools by keyword",
    "do_POST": "http.server's handler interface (benchmarks/agent_eval/scripted.py)",
    "log_message": "http.server's handler interface, silenced (benchmarks/agent_eval/scripted.py)",
    "create_stream": "torch.distributed.checkpoint's FileSystem interface (trainer/checkpoint_reader.py)",
    "readable": "io.RawIOBase's interface (trainer/checkpoint_reader.py)",
    "seekable": "io.RawIOBase's interface (trainer/checkpoint_reader.py)",
    "timeout": "torch.distributed.Work.wait's signature (trainer/shared_memory_comm.py)",
    "frame": "a signal handler's (signum, frame) signature",
    "_micro_pipeline_tp": "a torch._inductor.config switch, read by torch",
    "fill_uninitialized_memory": "a torch.utils.deterministic switch, read by torch",
    "record_all": "the scenario recipe, run by hand: record_all(drill_workspaces(root)) (docs/agent.md)",
    "drill_workspaces": "the scenario recipe, run by hand (benchmarks/agent_eval/recipe.py)",
    "sandbox_workspaces": "the scenario recipe, run by hand on a trainops sandbox cluster",
}
