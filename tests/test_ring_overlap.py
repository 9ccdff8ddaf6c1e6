"""The ring's overlap, as a fact of its code path: with overlap=True every K/V transfer is issued before the step's
compute and waited for after it; with overlap=False it completes before the compute starts; both compute the same
bits. (Seconds are measured and reported by the chapter, never asserted.)"""

from pylib.experiments.ring_overlap import ring_overlap_timings
from pylib.viz.cp_tables import overlap_order_rows, overlap_table_rows, ring_round_table_rows


def test_overlapped_ring_keeps_each_transfer_in_flight_across_the_compute_and_blocking_does_not():
    res = ring_overlap_timings(cp=2, s=64, n_head=2, n_kv_head=1, d_head=8, repeats=1)
    assert res["identical"]
    for name, in_flight in (("overlap", True), ("blocking", False)):
        assert len(res["orders"][name]) == 2  # one list per rank
        for steps in res["orders"][name]:
            assert [o["step"] for o in steps] == [0]  # cp = 2: one forward step has a next block
            assert all(o["spans_compute"] == in_flight and o["before_compute"] != in_flight for o in steps)
        v = res["variants"][name]
        assert v["wall"] > 0 and v["compute"] > 0 and v["wait"] >= 0
    assert res["kv_message_bytes"] == 2 * 1 * 1 * 32 * 8 * 4
    assert "CPU cores" in res["machine"]
    rows = overlap_table_rows(res)
    assert [r[0].split()[0] for r in rows] == ["overlapped", "blocking"] and all(len(r) == 5 for r in rows)
    marks = [["overlap", 0, "✓"], ["overlap", 1, "✓"], ["blocking", 0, "✗"], ["blocking", 1, "✗"]]
    assert overlap_order_rows(res) == marks


def test_round_table_rows_follow_the_rounds_read_from_the_trace():
    rounds = [dict(round=1, holds=[0, 1], recv_from=None), dict(round=2, holds=[1, 0], recv_from=[1, 0])]
    rows = ring_round_table_rows(rounds)
    assert rows[0] == ["round 1", "attends to K0V0", "attends to K1V1"]
    assert rows[1] == ["pass ↓", "receives K1V1 from rank 1", "receives K0V0 from rank 0"]
    assert rows[-1] == ["end", "Q has seen every K, V ✓", "Q has seen every K, V ✓"]
