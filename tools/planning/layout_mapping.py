"""Where a parallel layout's groups land on the declared topology, and what expert parallelism
costs on paper.

The topology is the one the environment declaration states (scale-up domain size, nodes), never
the host the planner runs on: a submit host without GPUs plans a GPU job, and a GPU host plans a
job for other nodes. Ranks are placed as torchrun places them, node by node in rank order, and the
mesh is row-major over (pp, dp_replicate, dp_shard, cp, tp), tp innermost, as the trainer lays it out.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Placement = Literal["not split", "inside one scale-up domain", "across scale-up domains in a node", "across nodes"]
MAX_EXPERTS = 4096

EP_FORMULA = ("bytes per rank per step = 4 (dispatch + combine, forward + backward) x moe_layers x micro-batches "
              "x tokens per micro-batch (micro_batch x seq_len / cp) x top_k x dim x bytes_per_element x (ep-1)/ep "
              "(the share of routed tokens that leave the rank, uniform routing); seconds = bytes x 8 / bandwidth. "
              "On paper: no capacity factor, no overlap with compute.")


class MoeShape(BaseModel):
    """A mixture-of-experts shape to budget expert parallelism for (the trainer itself runs dense models)."""

    model_config = ConfigDict(allow_inf_nan=False)

    experts: int = Field(gt=1, le=MAX_EXPERTS, description="Experts per MoE layer.")
    top_k: int = Field(ge=1, le=64, description="Experts each token is routed to.")
    ep: int | None = Field(None, ge=1, le=MAX_EXPERTS,
                           description="Expert-parallel degree, carved out of the data-parallel ranks; omit to derive "
                                       "it from experts, the data-parallel degree and the scale-up domain.")
    moe_layers: int | None = Field(None, ge=1, le=10_000, description="Layers with experts; default every layer.")
    bytes_per_element: int = Field(2, ge=1, le=8, description="Bytes per activation element sent (2 for bf16).")

    @model_validator(mode="after")
    def _fits(self) -> MoeShape:
        if self.top_k > self.experts:
            raise ValueError(f"moe.top_k={self.top_k} exceeds moe.experts={self.experts}: route each token to at "
                             "most every expert")
        if self.ep is not None and self.experts % self.ep:
            raise ValueError(f"moe.experts={self.experts} is not divisible by moe.ep={self.ep}: each expert-parallel "
                             f"rank holds experts/ep experts; pick ep from the divisors of {self.experts}, or omit "
                             "moe.ep to derive it")
        return self


class DimPlacement(BaseModel):
    dim: str = Field(description="Mesh dimension (pp, dp_replicate, dp_shard, cp, tp) or ep.")
    degree: int
    stride: int = Field(description="Rank distance between neighbours in one group.")
    placement: Placement = Field(description="Where the widest group of this dimension lands.")


class ExpertParallelEstimate(BaseModel):
    experts: int
    top_k: int
    ep: int
    ep_basis: str = Field("given", description="Whether ep was given, or derived and by which rule (plans made "
                                               "before ep could be derived had it given).")
    moe_layers: int
    tokens_per_microbatch: int = Field(description="Tokens one rank routes per micro-batch.")
    all_to_all_bytes_per_step: float = Field(description="Bytes one rank sends in expert all-to-alls per step.")
    placement: Placement = Field(description="Where an expert-parallel group lands.")
    bandwidth_gbit_s: float | None = Field(description="Declared bandwidth of the link the group crosses.")
    bandwidth_basis: str
    all_to_all_s_per_step: float | None = Field(description="bytes / bandwidth: seconds per step on the wire; None "
                                                            "without a declared bandwidth.")
    formula: str = EP_FORMULA


class TopologyPlan(BaseModel):
    """The mapping and its cross-domain verdict."""

    nodes: int
    ranks_per_node: int
    domain_ranks: int = Field(description="Ranks sharing one scale-up domain (the node when none is declared).")
    domain_basis: str
    mapping: list[DimPlacement]
    tp_inside_domain: bool
    verdict: str = Field(description="Whether tensor parallel stays inside the scale-up domain, with the numbers.")
    expert_parallel: ExpertParallelEstimate | None = None


def _placement(world: int, stride: int, degree: int, domain: int, node: int) -> Placement:
    if degree == 1:
        return "not split"
    span = [(rank // stride // degree) * stride * degree + rank % stride for rank in range(world)]
    groups = {base: [base + k * stride for k in range(degree)] for base in set(span)}
    if all(g[0] // domain == g[-1] // domain for g in groups.values()):
        return "inside one scale-up domain"
    if all(g[0] // node == g[-1] // node for g in groups.values()):
        return "across scale-up domains in a node"
    return "across nodes"


def map_layout(mesh: dict[str, int], world: int, nodes: int, scale_up_domain: int | None) -> TopologyPlan:
    """Each mesh dimension's placement on `nodes` nodes of `world / nodes` ranks, `scale_up_domain`
    accelerators sharing NVLink (None: the node is the domain, as on a CPU host)."""
    per_node = world // nodes
    domain = min(scale_up_domain, per_node) if scale_up_domain else per_node
    basis = (f"declared scale-up domain of {scale_up_domain} accelerators" if scale_up_domain
             else "no scale-up domain declared (CPU host, or no NVLink matrix): the node is the domain")
    names, sizes = list(mesh), list(mesh.values())
    mapping = []
    for i, (name, degree) in enumerate(zip(names, sizes, strict=True)):
        stride = 1
        for inner in sizes[i + 1:]:
            stride *= inner
        mapping.append(DimPlacement(dim=name, degree=degree, stride=stride,
                                    placement=_placement(world, stride, degree, domain, per_node)))
    tp = mesh.get("tp", 1)
    inside = next(m for m in mapping if m.dim == "tp").placement in ("not split", "inside one scale-up domain")
    crossing = ", ".join(f"{m.dim}={m.degree}" for m in mapping if m.placement == "across nodes") or "none"
    if inside:
        verdict = (f"pass: tp={tp} stays inside one scale-up domain of {domain} rank(s) ({basis}); groups across "
                   f"nodes: {crossing}")
    else:
        verdict = (f"fail: tp={tp} crosses scale-up domains of {domain} rank(s) ({basis}): tensor parallel "
                   "all-reduces every layer and must stay on the scale-up fabric")
    return TopologyPlan(nodes=nodes, ranks_per_node=per_node, domain_ranks=domain, domain_basis=basis,
                        mapping=mapping, tp_inside_domain=inside, verdict=verdict)


def derive_ep(experts: int, dp: int, stride: int, world: int, domain: int, per_node: int) -> tuple[int, str]:
    """The expert-parallel degree for a declared shape: the largest that divides the experts (each rank
    holds experts/ep of them) and the data-parallel degree (ep is carved out of the dp ranks) and keeps
    each group inside one scale-up domain, since its all-to-all runs in every MoE layer, forward and
    backward, as tensor parallel's collectives do; 1 (every rank holds every expert) when none does."""
    common = [d for d in range(min(experts, dp), 0, -1) if experts % d == 0 and dp % d == 0]
    ep = next(d for d in common if d == 1 or _placement(world, stride, d, domain, per_node)
              == "inside one scale-up domain")
    rule = (f"derived: the largest degree dividing experts={experts} and dp={dp} whose group of ranks {stride} "
            f"apart stays inside one scale-up domain of {domain} rank(s)")
    if ep == 1 and common[0] > 1:
        least = common[-2]
        rule += (f"; no degree above 1 does (ep={least} spans {least * stride} ranks at tp x cp = {stride}), so every "
                 "rank holds every expert")
    return ep, rule


def expert_parallel(moe: MoeShape, layout, dim: int, n_layers: int, domain: int, per_node: int,
                    inter_node_gbit_s: float | None, intra_node_gbit_s: float | None) -> ExpertParallelEstimate:
    """All-to-all volume per step against the declared link the expert-parallel group crosses; ep as
    given, or derived from the shape and the layout (derive_ep) when the shape leaves it out."""
    stride = layout.cp * layout.tp
    world = layout.world_size
    if moe.ep is None:
        ep, ep_basis = derive_ep(moe.experts, layout.dp, stride, world, domain, per_node)
    elif layout.dp % moe.ep:
        raise ValueError(f"moe.ep={moe.ep} does not divide the data-parallel degree dp={layout.dp}: expert "
                         "parallelism is carved out of the data-parallel ranks; pick ep from the divisors of "
                         f"{layout.dp}, or omit moe.ep to derive it")
    else:
        ep, ep_basis = moe.ep, f"given: moe.ep={moe.ep}"
    placement = _placement(world, stride, ep, domain, per_node) if ep > 1 else "not split"
    layers = moe.moe_layers or n_layers
    tokens = layout.micro_batch * layout.seq_len // layout.cp
    volume = (4 * layers * layout.grad_accumulation * tokens * moe.top_k * dim * moe.bytes_per_element
              * (ep - 1) / ep)
    if placement == "across nodes":
        bandwidth, basis = inter_node_gbit_s, "declared inter-node bandwidth"
    elif placement == "not split":
        bandwidth, basis = None, "ep=1: no expert all-to-all"
    else:
        bandwidth, basis = intra_node_gbit_s, "declared intra-node (scale-up) bandwidth"
    if bandwidth is None and placement != "not split":
        field = "inter_node_gbit_s" if placement == "across nodes" else "intra_node_gbit_s"
        basis = f"not declared: pass {field} (trainops env --measure-interconnect measures the inter-node one)"
    seconds = volume * 8 / (bandwidth * 1e9) if bandwidth else (0.0 if ep == 1 else None)
    return ExpertParallelEstimate(experts=moe.experts, top_k=moe.top_k, ep=ep, ep_basis=ep_basis, moe_layers=layers,
                                  tokens_per_microbatch=tokens, all_to_all_bytes_per_step=volume, placement=placement,
                                  bandwidth_gbit_s=bandwidth, bandwidth_basis=basis, all_to_all_s_per_step=seconds)
