"""The reference model's configuration: plain data, so the torch-free layers (`pylib.plan`, `pylib.analysis`) and
the modules that run it (`pylib.model`) share one definition.

    ModelConfig(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, mlp, position, moe, dtype, ...)
    MoEConfig(n_experts, top_k, d_ff, score, capacity_factor, ...)       expert_capacity(n_tokens, moe)
    SEED_A, TINY                                                        (the named models: `pylib.plan.presets`)

Symbols follow article B: h = d_model, h_ffn = d_ff, n_head, n_kv_head, d_head = h / n_head, V = vocab_size,
L = n_layers, E = moe.n_experts. The dtype is a name (a key of `pylib.plan.options.DTYPE_BYTES`: "float32",
"float64", "bfloat16", "float16"); `pylib.model.torch_dtype` turns it into a torch dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .fields import choice, flag, instance, integer, number
from .heads import kv_group_problem
from .options import DTYPE_BYTES

SCORES = ("softmax", "sigmoid")
DROP_POLICIES = ("probs", "position")
DISPATCHERS = ("alltoall", "allgather")
MLPS = ("gelu", "swiglu")
POSITIONS = ("none", "rope")


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts MLP: `n_experts` expert MLPs, each token sent to `top_k` of them.

    score: "softmax" or "sigmoid" router scores. For softmax, `topk_then_softmax=True` takes the top-k logits and
    normalises over those (Mixtral), False takes softmax over all experts then top-k (Switch, DeepSeek-V2).
    Sigmoid scores are renormalised over the chosen k when k > 1 (DeepSeek-V3; with k = 1 the raw sigmoid is the
    weight, as in Megatron-Core, so the router still learns from the main loss).
    capacity_factor: None = no token is ever dropped; else each expert takes at most
    ceil((tokens * top_k / n_experts) * capacity_factor) tokens (in Megatron-Core's order of operations), keeping
    by `drop_policy` ("probs": the highest router probabilities, "position": the earliest tokens). `tokens` counts
    one drop group: the tokens one rank routes (Megatron-Core's default); see `expert_capacity` and
    pylib.model.moe.
    aux_loss_coef: weight of the load-balancing loss E * sum_i f_i * P_i; z_loss_coef: weight of the router
    z-loss mean(logsumexp(logits)^2). Both add gradient without changing the layer's forward value.
    bias_update_rate: step of the auxiliary-loss-free expert-bias update (DeepSeek-V3), applied by
    `MoE.update_expert_bias()`; 0 = the bias stays 0.
    n_shared_experts: experts every token goes through, beside the routed ones (DeepSeek-V2/V3, Qwen-MoE): one
    dense MLP of n_shared_experts * (expert h_ffn) hidden units, added unweighted (0 = none).
    n_groups, topk_groups: group-limited top-k (DeepSeek-V3; Megatron's moe_router_num_groups / group_topk): the
    experts in n_groups equal groups of consecutive ids, each token first keeps the topk_groups groups whose
    top_k // topk_groups best selection scores sum highest, then picks its top_k inside them. None = no limit.
    When the groups are the nodes of the EP group, this is node-limited routing.
    dispatcher: "alltoall" (rows to the ranks of their experts) or "allgather" (every rank gathers the EP x ETP
    group's tokens and keeps its experts' rows; Megatron's MoEAllGatherTokenDispatcher).
    pad_to_capacity: every expert receives exactly C rows from every rank, zero rows filling the gaps (fixed shapes;
    Megatron's --moe-pad-expert-input-to-capacity); needs a capacity_factor and the all-to-all dispatcher.
    """

    n_experts: int = 8
    top_k: int = 2
    d_ff: int | None = None  # expert hidden size; None = the model's d_ff
    score: str = "softmax"
    topk_then_softmax: bool = False
    capacity_factor: float | None = None
    drop_policy: str = "probs"
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    bias_update_rate: float = 0.0
    every: int = 1  # layer i is MoE when i % every == every - 1 (every=1: all layers)
    n_shared_experts: int = 0
    n_groups: int = 1
    topk_groups: int | None = None
    dispatcher: str = "alltoall"
    pad_to_capacity: bool = False

    def __post_init__(self):
        # every field checked before any rule reads it (pylib.plan.fields: the type, finiteness and range)
        for name in ("n_experts", "every"):
            object.__setattr__(self, name, integer("MoEConfig", name, getattr(self, name)))
        object.__setattr__(self, "top_k", integer("MoEConfig", "top_k", self.top_k, low=None))  # 1..E: below
        object.__setattr__(self, "d_ff", integer("MoEConfig", "d_ff", self.d_ff, none=True))
        choice("MoEConfig", "score", self.score, SCORES)
        flag("MoEConfig", "topk_then_softmax", self.topk_then_softmax)
        number("MoEConfig", "capacity_factor", self.capacity_factor, above=0, none=True)
        choice("MoEConfig", "drop_policy", self.drop_policy, DROP_POLICIES)
        for name in ("aux_loss_coef", "z_loss_coef", "bias_update_rate"):
            number("MoEConfig", name, getattr(self, name), low=0)
        object.__setattr__(
            self, "n_shared_experts", integer("MoEConfig", "n_shared_experts", self.n_shared_experts, low=0)
        )
        object.__setattr__(self, "n_groups", integer("MoEConfig", "n_groups", self.n_groups))
        object.__setattr__(self, "topk_groups", integer("MoEConfig", "topk_groups", self.topk_groups, none=True))
        choice("MoEConfig", "dispatcher", self.dispatcher, DISPATCHERS)
        flag("MoEConfig", "pad_to_capacity", self.pad_to_capacity)
        bad = routing_problems(self)
        if bad:
            raise ValueError(bad[0])


def routing_problems(moe) -> list[str]:
    """The routing rules of an MoE layer `moe` (a `MoEConfig`, or anything with n_experts, top_k and
    capacity_factor), as sentences: k experts out of E, and a positive capacity factor. `MoEConfig` raises the
    first; `pylib.plan.problems.expert_parallel_problems` lists them with the mesh's."""
    out = []
    if not 1 <= moe.top_k <= moe.n_experts:
        out.append(f"top_k={moe.top_k} must be between 1 and n_experts={moe.n_experts}")
    if moe.capacity_factor is not None and moe.capacity_factor <= 0:
        out.append(f"capacity_factor={moe.capacity_factor} must be > 0 (or None for no dropping)")
    out += group_routing_problems(moe)
    if getattr(moe, "pad_to_capacity", False):
        if moe.capacity_factor is None:
            out.append("pad_to_capacity=True pads every expert to its capacity C: it needs a capacity_factor")
        if moe.dispatcher != "alltoall":
            out.append(f"pad_to_capacity=True pads the all-to-all's rows; dispatcher={moe.dispatcher!r} has none")
    return out


def group_routing_problems(moe) -> list[str]:
    """The rules of group-limited top-k: n_groups divides n_experts, 1 <= topk_groups <= n_groups, topk_groups <=
    top_k (each kept group is scored by its top_k // topk_groups best experts), and the kept groups hold at least
    top_k experts."""
    G = getattr(moe, "n_groups", 1)
    if G == 1 and getattr(moe, "topk_groups", None) is None:
        return []
    M = G if moe.topk_groups is None else moe.topk_groups
    if moe.n_experts % G:
        return [f"n_groups={G} does not divide n_experts={moe.n_experts}"]
    out = []
    if not 1 <= M <= G:
        out.append(f"topk_groups={M} must be between 1 and n_groups={G}")
    if M > moe.top_k:
        out.append(
            f"topk_groups={M} must be at most top_k={moe.top_k}: "
            "a group is scored by its top_k // topk_groups best experts"
        )
    elif M * (moe.n_experts // G) < moe.top_k:
        out.append(f"top_k={moe.top_k} experts do not fit in topk_groups={M} groups of {moe.n_experts // G} experts")
    return out


def expert_capacity(n_tokens: int, moe: MoEConfig) -> int | None:
    """C = ceil((T * k / E) * capacity_factor) for T tokens routed together, or None when nothing is dropped.

    As Megatron-Core's get_capacity(T * k, E, capacity_factor), in its order of operations: in floating point
    ceil(1.1 * 100 / 5) = 23 but ceil((100 / 5) * 1.1) = 22. T is the number of tokens of one drop group (one
    rank's tokens in an expert-parallel run). The reference MoE (`pylib.model.moe`) and the expert-parallel layer
    drop by it; the analysis counts the drops with its C (`pylib.analysis.ep.dropped_assignments`)."""
    if moe.capacity_factor is None:
        return None
    return math.ceil((n_tokens * moe.top_k / moe.n_experts) * moe.capacity_factor)


@dataclass(frozen=True)
class ModelConfig:
    """A Pre-LN decoder: embedding, n_layers x [LN, attention, residual, LN, MLP, residual], final LN, LM head.

    mlp: "gelu" (up, GELU, down) or "swiglu" (down(silu(gate x) * up x)).
    position: "none" (the token embedding alone, as in article A) or "rope" (rotary embedding on q and k).
    causal: causal self-attention (a language model) or full (as in article A's example).
    Weights are PyTorch's default initialisation after torch.manual_seed(seed), modules created in reading order
    (embedding; per layer q, k, v, o, then MLP; LM head), so a config and a seed fix every number.
    """

    vocab_size: int = 64
    d_model: int = 16
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (MHA); fewer = GQA; 1 = MQA
    d_ff: int = 64
    mlp: str = "gelu"
    position: str = "none"
    causal: bool = True
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    moe: MoEConfig | None = None
    tie_embeddings: bool = False
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self):
        # each field alone first (pylib.plan.fields), then the rules between fields, all named in one message
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff"):
            object.__setattr__(self, name, integer("ModelConfig", name, getattr(self, name)))
        object.__setattr__(self, "n_kv_heads", integer("ModelConfig", "n_kv_heads", self.n_kv_heads, none=True))
        object.__setattr__(self, "seed", integer("ModelConfig", "seed", self.seed, low=0, high=2**64 - 1))
        choice("ModelConfig", "mlp", self.mlp, MLPS)
        choice("ModelConfig", "position", self.position, POSITIONS)
        choice("ModelConfig", "dtype", self.dtype, tuple(DTYPE_BYTES))
        for name in ("causal", "tie_embeddings"):
            flag("ModelConfig", name, getattr(self, name))
        for name in ("norm_eps", "rope_base"):
            number("ModelConfig", name, getattr(self, name), above=0)
        instance("ModelConfig", "moe", self.moe, MoEConfig, none=True)
        problems = []
        if self.d_model % self.n_heads:
            problems.append(f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        if kv := kv_group_problem(self.n_heads, self.kv_heads):
            problems.append(kv)
        if self.position == "rope" and (self.d_model // self.n_heads) % 2:
            problems.append(f"rope needs an even d_head, got {self.d_model // self.n_heads}")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_kv(self) -> int:
        """h_kv = n_kv_head * d_head, the width of K and V."""
        return self.kv_heads * self.d_head

    def is_moe_layer(self, i: int) -> bool:
        return self.moe is not None and i % self.moe.every == self.moe.every - 1

    def with_(self, **changes) -> ModelConfig:
        return replace(self, **changes)

    @staticmethod
    def seed_a() -> ModelConfig:
        """Article A's worked example: d=4, one head, d_ff=8, GELU, no positions, full attention, 8 tokens in the
        vocabulary (the two sentences "The cat sat here" and "A dog ran fast"), seed 0."""
        return ModelConfig(
            vocab_size=8, d_model=4, n_layers=1, n_heads=1, d_ff=8, mlp="gelu", position="none", causal=False, seed=0
        )


TINY = ModelConfig()
SEED_A = ModelConfig.seed_a()


__all__ = ["SEED_A", "TINY", "ModelConfig", "MoEConfig", "expert_capacity", "routing_problems"]
