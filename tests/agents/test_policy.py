"""Understanding a request (agents/understand.py, agents/kinds.py) and the offline policy's argument
filling and plans, as specifications. The phrases are the developer's own, on-call style; none is
taken from a frozen benchmark set."""
from __future__ import annotations

import pytest
from langchain_core.messages import ToolMessage

from trainops.agents import sop_walk
from trainops.agents.explain import explain_mfu
from trainops.agents.kinds import BY_NAME
from trainops.agents.policy import fill_args, steps
from trainops.agents.understand import Job, World, concepts_of, observe_world, order_verbs, understand
from trainops.skills.sop_session import SopSession, SopSettings, StepLog
from trainops.tools.backends import backends
from trainops.tools.context import CallContext
from trainops.tools.governance.text import check_text
from trainops.tools.schedulers import session_kinds
from trainops.tools.schedulers.local import LocalScheduler
from trainops.tools.schedulers.slurm import SlurmScheduler
from trainops.tools.schedulers.slurm_transport import SlurmJob, SlurmNode

CRASH, CKPT = "drill-crash-20261202-133205-2e52bc", "drill-checkpoint-corruption-20261202-133417-adfc26"
WORLD = World(runs=["run-20261202-133205-560cf2", "run-20261202-133417-bf6e4c", "run-a", "run-b"],
              jobs=[Job(id=CRASH, name="drill-crash", run="run-20261202-133205-560cf2", when=1.0),
                    Job(id=CKPT, name="drill-checkpoint-corruption", run="run-20261202-133417-bf6e4c", when=2.0),
                    Job(id="4", name="drill-node-crash", when=3.0)],
              nodes={"n1": "local", "n2.cluster.local": "local", "n3": "local"})


@pytest.mark.parametrize("text, act, kind, order", [
    ("cancel 2e52bc pls", "order", "cancel", "cancel_job"),  # a suffix of the id
    ("cancle 2e52bc pls", "question", "diagnose", None),  # a near word never orders: it reads
    ("can u requeue the crash job", "order", "requeue", "requeue_job"),
    ("job 4 died, drain n2", "order", "drain", "drain_node"),  # a clause after a comma, a short name
    ("take n3 out of service", "order", "drain", "drain_node"),
    ("how did the crash drill go?", "question", "diagnose", None),  # a question about a drill never acts
    ("what did the crash drill show, should we requeue?", "question", "diagnose", None),
    ("Why did job 2e52bc fail? Should I cancel it?", "question", "diagnose", None),
    ("any stragler on 133205?", "question", "straggler", None),
    ("how much time did we lose on the crash drill", "question", "time_lost", None),
    ("is a ckpt of bf6e4c corrupt", "question", "checkpoints", None),
    ("mfu of the latest run?", "question", "mfu", None),
    ("why is run-b slower than run-a", "question", "compare", None),
    ("how often should we checkpoint with a 5 min save and 3h mtbf", "plan", "checkpoint_interval", None),
    ("anything waiting for my approval?", "question", "approvals", None),
    ("training feels sluggish today, why", "question", "symptom", None),
    ("I'd like to train a model", "question", None, None),  # "train" is never "drain"
    ("make me a sandwich", "question", None, None),
])
def test_a_request_is_understood_as_its_act_and_kind(text, act, kind, order):
    request = understand(text, WORLD)
    assert (request.act, request.kind, request.order) == (act, kind, order)


def test_ids_are_resolved_whole_or_by_a_unique_part_and_a_job_brings_its_run():
    found = understand("what happened to 2e52bc", WORLD).entities
    assert found.jobs == [CRASH] and found.runs == ["run-20261202-133205-560cf2"]
    assert understand("job 4?", WORLD).entities.jobs == ["4"]
    assert understand("look at node 2", WORLD).entities.nodes == ["n2.cluster.local"]  # the scheduler's own name
    assert understand("what broke in the last job", WORLD).entities.jobs == ["4"]
    assert understand("what broke in the checkpoint-corruption drill", WORLD).entities.jobs == [CKPT]


def test_an_ambiguous_part_is_asked_back_with_its_candidates_never_guessed():
    request = understand("what happened to 20261202", WORLD)
    [ambiguous] = request.ambiguous
    assert set(ambiguous.candidates) == {CRASH, CKPT} and not request.entities.jobs


def test_near_words_need_five_letters_and_the_first_letter():
    assert "drain" in concepts_of("drian") and "straggler" in concepts_of("stragler")
    assert not order_verbs("drian") and not order_verbs("drained") and order_verbs("drain") == {"drain"}
    assert "drain" not in concepts_of("train") and "log" not in concepts_of("lots")


def test_durations_counts_and_the_baseline_are_read_from_the_words():
    found = understand("a 5-minute save, a 90 s restart and an MTBF of 3 hours", WORLD).entities
    assert found.durations_s == {"save": 300.0, "restart": 90.0, "mtbf": 10800.0}
    quota = understand("give tenant team-a 64 GPUs at high priority", WORLD).entities
    assert (quota.tenant, quota.counts, quota.priority) == ("team-a", {"gpus": 64}, "high")
    assert understand("why is run-b slower than run-a", WORLD).entities.baseline_first is False


def test_duration_fields_are_filled_in_the_unit_their_name_states():
    request = understand("a 300 s save, a 2 min restart and an mtbf of 3 hours", WORLD)
    schema = {"properties": {"save_s": {}, "mtbf_h": {}, "restart_min": {}}, "required": ["save_s", "mtbf_h"]}
    assert fill_args(schema, request, {}) == ({"save_s": 300.0, "mtbf_h": 3.0, "restart_min": 2.0}, [])


def test_a_crash_drill_prefers_killing_the_rank_and_missing_fields_are_reported():
    schema = {"properties": {"kind": {"enum": ["crash", "kill_rank", "hang"]}, "run": {}}, "required": ["kind", "run"]}
    assert fill_args(schema, understand("drill a crash", World()), {}) == ({"kind": "kill_rank"}, ["run"])


def test_the_sop_answer_leads_with_the_verdict_lists_each_step_and_names_the_pack_to_decide():
    """Rendering only: a real walk takes minutes (tests/skills/test_agent_walks_the_sop.py)."""
    steps = [StepLog(step="S2", tool="sop_baseline", at=1.0, result="MFU 15.624%, step 0.0584 s over 2 repeats"),
             StepLog(step="S6", tool="sop_pack", at=2.0, result="pack sop-1: partial")]
    session = SopSession(session_id="sop-x", created=0.0, settings=SopSettings(quick=True), steps=steps)
    pack = {"verdict": "partial", "blockers": ["drill hang: recovery not measured"], "pack_id": "sop-1",
            "report_html": "/w/packs/sop-1/report.html", "approve_command": "trainops approve sop-1"}
    text = sop_walk.answer(session, pack)
    assert text.splitlines()[0] == "Verdict: partial; blockers: drill hang: recovery not measured"
    assert "  S2  sop_baseline  MFU 15.624%, step 0.0584 s over 2 repeats" in text
    assert "trainops approve sop-1 (signed with their SSH key)" in text and "trainops reject sop-1 --note WHY" in text
    assert check_text(text) == []


def test_the_mfu_answer_quotes_each_figure_with_the_record_it_comes_from():
    summary = {"run": "r1", "ranks": 2, "steps_measured": 4, "mfu_pct_median": 3.0, "data_wait_share_pct": 20.0,
               "step_time_median_s": 0.2, "step_time_rank_spread_pct": 1.0, "peak_source": "measured CPU GEMM"}
    text = "\n".join(explain_mfu(summary, {}))
    assert "3.00% (summarize_run:mfu_pct_median, median over 4 measured steps of 2 ranks)" in text
    assert "20.0% of each step waits for data (summarize_run:data_wait_share_pct)" in text


def _status(nodes: list[str]) -> ToolMessage:
    return ToolMessage(content="", name="job_status", tool_call_id="c0", status="success",
                       artifact={"job_id": "4", "backend": "slurm", "state": "failed", "nodes": nodes})


NODES = ToolMessage(content="", name="list_nodes", tool_call_id="c1", status="success",
                    artifact={"nodes": [{"name": n, "state": "idle"} for n in ("n1", "n2", "n3")]})
SCHEMAS = {"job_status": {"properties": {"job_id": {}, "scheduler": {}}, "required": ["job_id"]},
           "list_nodes": {"properties": {"scheduler": {}}},
           "drain_node": {"properties": {"scheduler": {}, "node": {}, "reason": {}}, "required": ["node"]},
           "cancel_job": {"properties": {"job_id": {}, "scheduler": {}, "force": {}}, "required": ["job_id"]},
           "set_tenant_quota": {"properties": {"tenant": {}, "gpus": {}, "priority": {}, "reason": {}},
                                "required": ["tenant", "priority", "reason"]}}


def next_step(tool: str, request, results: list[ToolMessage]):
    """The order's next step after `results` (each result's call counted as made)."""
    kind = next(k for k in BY_NAME.values() if k.order == tool)
    return steps(kind, request, {r.name: {} for r in results}, results, SCHEMAS)


def test_a_drain_order_for_a_job_on_several_nodes_asks_which_instead_of_guessing():
    made = next_step("drain_node", understand("drain the node of job 4", WORLD), [_status(["n1", "n3"]), NODES])
    assert made["verdict"] == "inconclusive" and "2 nodes (n1, n3)" in made["summary"]


def test_a_drain_order_naming_a_node_drains_it_only_once_the_scheduler_lists_it():
    world = WORLD.model_copy(update={"nodes": {"n1": "slurm", "n2": "slurm", "n3": "slurm"}})
    drain = understand("Node n2 died under job 4. Drain it.", world)
    ask, _ = next_step("drain_node", drain, [_status(["n1", "n3"])])
    assert ask == "list_nodes"  # the node is read from the scheduler's list, never from the words alone
    made, args = next_step("drain_node", drain, [_status(["n1", "n3"]), NODES])
    assert (made, args["node"], args["scheduler"]) == ("drain_node", "n2", "slurm")
    unknown = understand("Node n9 died under job 4. Drain it.", world)
    refused = next_step("drain_node", unknown, [_status(["n1", "n3"]), NODES])
    assert "n9, which the scheduler does not list" in refused["summary"]
    one, args = next_step("drain_node", understand("drain the node of job 4", world), [_status(["n3"]), NODES])
    assert (one, args["node"]) == ("drain_node", "n3")  # no node named: the job's only node


def test_the_quota_order_takes_tenant_size_and_priority_from_the_request():
    made, args = next_step("set_tenant_quota", understand("Give tenant team-a 64 GPUs at high priority.", WORLD), [])
    assert made == "set_tenant_quota"
    assert {k: args[k] for k in ("tenant", "gpus", "priority")} == {"tenant": "team-a", "gpus": 64, "priority": "high"}


class SlurmCli:
    """The Slurm CLI's answers (squeue, sinfo, scontrol show hostnames) for a cluster of four nodes."""

    def jobs(self) -> list[SlurmJob]:
        return [SlurmJob(job_id=job_id, name=name, state="FAILED", exit_code=1, exit_signal=0, nodelist="n[1-2]",
                         reason="NonZeroExitCode", started_at=None, ended_at=None, submitted_at=when)
                for job_id, name, when in (("4187", "drill-crash", 1.0), ("4203", "drill-hang", 2.0))]

    def hostnames(self, nodelist: str) -> list[str]:
        return ["n1", "n2"] if nodelist else []

    def nodes(self) -> list[SlurmNode]:
        return [SlurmNode(name=f"n{i}.cluster.local", state="idle") for i in range(1, 5)]


def test_slurm_job_ids_resolve_through_the_sessions_scheduler_and_carry_it_into_the_order(workspace):
    """Production resolved ids on the local scheduler alone: a Slurm job id, whole or by a unique part,
    resolves through the Slurm backend's own list_jobs (called through the gated read tool), and the
    order's scheduler reads go to Slurm."""
    slurm = SlurmScheduler(transport=SlurmCli())
    with backends(scheduler=lambda kind: slurm if kind == "slurm" else LocalScheduler()):
        world = observe_world(CallContext(actor="agent"))
    assert {(j.id, j.scheduler) for j in world.jobs} >= {("4187", "slurm"), ("4203", "slurm")}
    assert world.nodes["n3.cluster.local"] == "slurm"
    found = understand("why did 4187 fail", world).entities
    assert (found.jobs, found.scheduler) == (["4187"], "slurm")
    assert understand("what happened to job 203", world).entities.jobs == ["4203"]  # a unique suffix
    assert understand("drain n3", world).entities.nodes == ["n3.cluster.local"]  # the scheduler's own name
    cancel = understand("cancel job 4187", world)
    assert next_step("cancel_job", cancel, []) == ("job_status", {"job_id": "4187", "scheduler": "slurm"})


def test_the_session_asks_slurm_only_where_a_cluster_is_configured(workspace, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(workspace / "slurm.conf"))
    assert session_kinds() == ["local", "slurm"]
    with backends(scheduler=lambda kind: LocalScheduler()):
        assert session_kinds() == ["local", "slurm", "kubernetes"]  # an injected provider serves every kind
