"""Load balance while the composed model trains: aux-loss-free balancing against the auxiliary loss and neither.

    run = balance_during_training(steps=30)         # one launch of 2 ranks (dp 2, ep 2), four routers in turn
    run.imbalance[name]                            # per step: the worse MoE layer's max / mean expert load
    run.biases[name]                               # per step: each MoE layer's expert bias after the step
    reference_biases(name)                         # the same on one device: equal to run.biases[name]

Every variant is the same tiny MoE Transformer (`VARIANTS`: 4 layers, layers 1 and 3 an 8-expert top-2 MoE),
trained by `ParallelTransformer.step` on 2 ranks (dp 2, ep 2, ZeRO-1, 2 microbatches) on the same "pattern"
batches with Adam; only the router and the balancing rule differ: softmax without and with the auxiliary loss,
sigmoid (DeepSeek-V3's router, the one Megatron-Core's expert bias requires) without and with the expert bias. The
load of a step is what the bias update reads: each rank's routed assignments of every microbatch
(`StepResult.expert_counts`), summed over the ranks of the layer's pipeline stage (`step_loads`) -- the total the
tp-dp-cp all-reduce gives the bias update. max / mean = 1 is perfect balance; E / k = 4 is every token on the
same k experts. Deterministic (float64 on gloo, fixed data and weights).
"""

from __future__ import annotations

from dataclasses import dataclass

from pylib.compose import ParallelTransformer
from pylib.experiments.compose_training import train_reference
from pylib.model import MoEConfig, batches, build_model
from pylib.plan.options import RunOptions
from pylib.plan.presets import tiny
from pylib.runtime import Mesh, ParallelConfig, launch

MOE = dict(n_experts=8, top_k=2, every=2)
AUX_COEF, BIAS_RATE = 0.1, 0.01  # larger than production (1e-2, 1e-3): 30 steps is a short run
VARIANTS = {  # name -> the MoE config of the run (the names of the single-device comparison in the EP chapter)
    "softmax, no balancing": MoEConfig(**MOE),
    "softmax + aux loss 0.1": MoEConfig(**MOE, aux_loss_coef=AUX_COEF),
    "sigmoid, no balancing": MoEConfig(**MOE, score="sigmoid"),
    "sigmoid + expert bias, u = 0.01": MoEConfig(**MOE, score="sigmoid", bias_update_rate=BIAS_RATE),
}
PAR = ParallelConfig(dp=2, ep=2)  # EP folded into DP: each rank routes its own rows, holds 4 of the 8 experts
OPTIONS = RunOptions(zero_stage=1, n_microbatches=1)
BATCH, SEQ, LR = 16, 16, 1e-2  # 512 assignments per MoE layer per step, 64 per expert when even


def model_config(moe: MoEConfig):
    """The model every variant trains: `tiny` at 2 layers with RoPE, layer 1 the MoE `moe`."""
    return tiny().with_(n_layers=2, position="rope", moe=moe)


@dataclass
class BalanceCurves:
    """Per variant, per step: `counts` {MoE layer: [E] assignments of the whole global batch}, `imbalance` (the
    worse layer's max / mean), `losses`, and `biases` {MoE layer: the bias after the step}; `ranks_agree`: every
    rank held the same bias after every step, in every variant."""

    counts: dict[str, list[dict[int, list[int]]]]
    imbalance: dict[str, list[float]]
    losses: dict[str, list[float]]
    biases: dict[str, list[dict[int, list[float]]]]
    steps: int
    ranks_agree: bool

    def mean_over(self, name: str, first: int, last: int) -> float:
        """The mean imbalance of steps [first, last) of one variant."""
        values = self.imbalance[name][first:last]
        return sum(values) / len(values)


def _worker(steps: int) -> dict:
    mesh = Mesh(PAR)
    out = {}
    for name, moe in VARIANTS.items():
        cfg = model_config(moe)
        model = ParallelTransformer.from_full(build_model(cfg), mesh, OPTIONS, batch=BATCH, seq=SEQ, lr=LR)
        run = dict(counts=[], losses=[], biases=[])
        for step in range(steps):
            res = model.step(*batches(cfg, BATCH, SEQ, step, data="pattern"), measure_memory=False)
            run["counts"].append({k: v.tolist() for k, v in res.expert_counts.items()})
            run["losses"].append(res.loss)
            layers = {i: m for s in model.stages for i, m in s.moe_layers().items()}
            run["biases"].append({i: m.router.expert_bias.tolist() for i, m in layers.items()})
        out[name] = run
    return out


def step_loads(ranks: list[dict], steps: int) -> list[dict[int, list[int]]]:
    """Per step, {MoE layer: [E] assignments of the whole global batch}: every rank's `expert_counts` of that
    step added up (each rank routed only its own tokens, so the sum counts each token once)."""
    out = []
    for step in range(steps):
        total: dict[int, list[int]] = {}
        for counts in ranks:
            for layer, c in counts[step].items():
                total[layer] = [a + b for a, b in zip(total.get(layer, [0] * len(c)), c)]
        out.append(total)
    return out


def worst_imbalance(loads: dict[int, list[int]]) -> float:
    """max / mean expert load of the worse MoE layer of one step."""
    return max(max(c) * len(c) / sum(c) for c in loads.values())


def balance_during_training(steps: int = 30) -> BalanceCurves:
    """Train the `VARIANTS` for `steps` steps on `PAR` with `OPTIONS` (one launch) and measure each step's load."""
    ranks = launch(_worker, PAR.dense_world_size, steps)
    counts, imbalance, losses, biases, agree = {}, {}, {}, {}, True
    for name in VARIANTS:
        counts[name] = step_loads([r[name]["counts"] for r in ranks], steps)
        imbalance[name] = [worst_imbalance(t) for t in counts[name]]
        losses[name] = ranks[0][name]["losses"]
        biases[name] = ranks[0][name]["biases"]
        agree = agree and all(r[name]["biases"] == biases[name] for r in ranks)
    return BalanceCurves(counts, imbalance, losses, biases, steps, agree)


def reference_biases(name: str, steps: int = 30) -> list[dict[int, list[float]]]:
    """Per step, each MoE layer's expert bias of variant `name` trained on one device on the whole global batch
    (`train_reference`: the bias updated once per step from the global counts)."""
    cfg = model_config(VARIANTS[name])
    ref = train_reference(cfg, steps=steps, batch=BATCH, seq=SEQ, lr=LR, data="pattern")
    return [{i: b.tolist() for i, b in step.items()} for step in ref["expert_bias"]]
