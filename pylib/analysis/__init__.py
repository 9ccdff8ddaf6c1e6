"""Formulas as pure functions of sizes: traffic, memory, bubble, and the planner built on them.

No processes here: every function takes sizes (a ModelConfig, a ParallelConfig, batch and sequence lengths) and
returns numbers. The tests check each formula against the tracer and the memory probes on real runs at small
sizes, and the book evaluates the same functions at real model sizes. One module per parallelism:

    tp           collectives of a TP/SP layer and model, saved activations, Korthikanti et al. 2022 comparison
    cp           ring and Ulysses traffic, causal work per rank, saved bytes
    ep           all-to-all bytes from a routing, capacity, expert parameters per rank
    pp           bubble, in-flight microbatches, activation memory, P2P bytes
    dp           DDP / ZeRO-1/2/3 traffic and held bytes, the ZeRO paper's numbers
    compose      one composed training step's traffic per rank and per axis: the one traffic model
    weights      per-rank shapes of every weight, parameter counts (what the planner sizes parameters from)
    shapes       per-rank shapes of every activation, memory and traffic for any model and config (the explorer's)
    activations  saved-activation bytes per layer, per pipeline chunk and at the schedule's peak (composed model)
    planner      every valid plan for a model and cluster, per-rank memory and traffic predicted, ranked by a cost model

One model of each thing: traffic is `compose.step_traffic` (the sum of the per-mode formulas; `shapes.traffic`
lists it by mode), memory is `planner.rank_memory` (`shapes.memory` asks it), validity is `pylib.plan.problems`.
This package imports only `pylib.plan`, `pylib.i18n` and the standard library: importing it loads no torch.

Import from the module: `from pylib.analysis.tp import layer_traffic`.
"""
