"""The dispatcher's traffic as the tracer records it: two all-to-alls per MoE layer in forward (dispatch and
combine) plus the small count exchange, and bytes equal to the formula evaluated on the actual routing."""

import torch
import torch.distributed as dist

from pylib.analysis.ep import alltoall_bytes, dispatch_bytes_sent, dispatch_matrix, etp_gather_bytes
from pylib.ep import ExpertParallelMoE
from pylib.ep.traffic import traffic_matrix
from pylib.model.moe import MoE
from pylib.plan.config import MoEConfig
from pylib.runtime import Mesh, ParallelConfig, launch, tag, trace

H, F, E = 8, 16, 8
ROW = H * 8  # one float64 row of h numbers


def _layers(cfg, n_layers=2):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return [MoE(H, F, cfg).double() for _ in range(n_layers)]


def _run(cfg, ep, etp, tokens):
    mesh = Mesh(ParallelConfig(dp=ep * etp, ep=ep, etp=etp))
    r = dist.get_rank()
    layers = [ExpertParallelMoE.from_full(m, ep_group=mesh.ep, etp_group=mesh.etp) for m in _layers(cfg)]
    x = torch.randn(1, tokens, H, generator=torch.Generator().manual_seed(r), dtype=torch.float64, requires_grad=True)
    routings = []
    with trace() as tr:
        h = x
        for i, layer in enumerate(layers):
            with tag(f"layers.{i}.mlp"):
                h = h + layer(h)
            routings.append((layer.last_routing.experts, layer.last_keep, layer.last_state.output_splits))
        h.sum().backward()
    return dict(
        events=[e.as_dict() for e in tr.events],
        routings=routings,
        ep_rank=mesh.ep.rank,
        etp_rank=mesh.etp.rank,
        ep_ranks=mesh.ep.ranks,
    )


def _ops(events, phase, layer):
    return [
        (e["op"], e["tag"].rsplit(".", 1)[-1])
        for e in events
        if e["phase"] == phase and e["tag"].startswith(f"layers.{layer}.mlp")
    ]


def test_forward_has_two_all_to_alls_per_moe_layer_plus_the_count_exchange():
    results = launch(_run, 4, MoEConfig(n_experts=E, top_k=2), 4, 1, 8)
    for res in results:
        for layer in (0, 1):
            assert _ops(res["events"], "forward", layer) == [
                ("all_to_all", "counts"),
                ("all_to_all", "dispatch"),
                ("all_to_all", "combine"),
            ]
            # backward undoes combine, then dispatch: the same two all-to-alls, no count exchange
            assert _ops(res["events"], "backward", layer) == [("all_to_all", "combine"), ("all_to_all", "dispatch")]


def _check_bytes(results, cfg, tokens, dropping):
    ep = len(results)
    for layer in (0, 1):
        experts = [res["routings"][layer][0] for res in results]
        keeps = [res["routings"][layer][1] for res in results]
        matrix = dispatch_matrix(experts, E, keeps)
        per_rank = alltoall_bytes(matrix, H, 8)
        traced = traffic_matrix([res["events"] for res in results], ep, tag=f"layers.{layer}.mlp.dispatch")
        assert traced == [[c * ROW for c in row] for row in matrix]  # rank x rank, diagonal = stays local
        n_dropped = sum(int((~k).sum()) for k in keeps)
        assert (n_dropped > 0) == dropping
        for r, res in enumerate(results):
            ev = {
                (e["phase"], e["tag"].rsplit(".", 1)[-1]): e
                for e in res["events"]
                if e["op"] == "all_to_all" and e["tag"].startswith(f"layers.{layer}.mlp")
            }
            simple = dispatch_bytes_sent(experts[r], r, E, ep, H, 8, keeps[r])  # T*k*h*b - local (- dropped)
            if not dropping:
                assert simple == (tokens * cfg.top_k - matrix[r][r]) * ROW
            for phase in ("forward", "backward"):
                d, c = ev[(phase, "dispatch")], ev[(phase, "combine")]
                fwd = phase == "forward"
                assert d["bytes_sent"] == (per_rank[r]["dispatch_sent"] if fwd else per_rank[r]["dispatch_recv"])
                assert d["bytes_recv"] == (per_rank[r]["dispatch_recv"] if fwd else per_rank[r]["dispatch_sent"])
                assert c["bytes_sent"] == (per_rank[r]["combine_sent"] if fwd else per_rank[r]["combine_recv"])
            assert ev[("forward", "dispatch")]["bytes_sent"] == simple


def test_all_to_all_bytes_equal_the_formula_from_the_actual_routing():
    cfg = MoEConfig(n_experts=E, top_k=2)
    _check_bytes(launch(_run, 4, cfg, 4, 1, 8), cfg, 8, dropping=False)


def test_dropped_assignments_are_not_sent():
    cfg = MoEConfig(n_experts=E, top_k=2, capacity_factor=0.5)
    _check_bytes(launch(_run, 4, cfg, 4, 1, 8), cfg, 8, dropping=True)


def test_etp_gathers_the_received_rows_and_reduce_scatters_the_partial_outputs():
    cfg = MoEConfig(n_experts=E, top_k=2)
    results = launch(_run, 4, cfg, 2, 2, 6)  # ETP groups {0,1} {2,3}, EP groups {0,2} {1,3}
    for res in results:
        ops = _ops(res["events"], "forward", 0)
        assert ops == [
            ("all_to_all", "counts"),
            ("all_gather", "counts"),
            ("all_to_all", "dispatch"),
            ("all_gather", "dispatch"),
            ("reduce_scatter", "combine"),
            ("all_to_all", "combine"),
        ]
    # rows each ETP member received from its EP all-to-all, then the gather/scatter bytes by the ring formula
    for res in results:
        etp_peers = [p for p in results if p["ep_rank"] == res["ep_rank"]]
        etp_peers.sort(key=lambda p: p["etp_rank"])
        rows = [sum(p["routings"][0][2]) for p in etp_peers]
        want = etp_gather_bytes(rows, res["etp_rank"], H, 8)
        ev = {
            e["op"]: e
            for e in res["events"]
            if e["phase"] == "forward"
            and e["tag"] in ("layers.0.mlp.dispatch", "layers.0.mlp.combine")
            and e["op"] != "all_to_all"
        }
        assert ev["all_gather"]["bytes_sent"] == want["all_gather_sent"]
        assert ev["all_gather"]["bytes_recv"] == want["all_gather_recv"]
        assert ev["reduce_scatter"]["bytes_sent"] == want["reduce_scatter_sent"]
        assert ev["reduce_scatter"]["bytes_recv"] == want["reduce_scatter_recv"]
        assert ev["all_gather"]["payload_bytes"] == sum(rows) * ROW
