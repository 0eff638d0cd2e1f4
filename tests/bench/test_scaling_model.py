"""bench/scaling_model.py: Amdahl's two terms fitted from the scaling rows, the node term from the
bytes that crossed, a bigger machine's rows checked against the prediction, the seed-scale
projection under both readings of the serial part; and docs/scaling.md holds exactly what the
model makes of the results file (it cannot drift from it)."""
from __future__ import annotations

import json

import pytest

from bench import scaling_model as sm
from bench.rows import row, summarize


def rows_for(workload: str, times: dict[int, float], two_nodes: tuple[float, float, float, float] | None = None):
    out = [summarize(row(f"{workload}: {n} workers vs 1 worker", "s", [t], [times[1]], orchard_label="o",
                         peer_label="p", higher_is_better=False)) for n, t in times.items() if n > 1]
    if two_nodes:
        one, more, lo_one, lo_more = two_nodes
        out.append(summarize(row(f"{workload}: 2 nodes vs one node (same 2 CPUs)", "s", [more], [one],
                                 orchard_label="o", peer_label="p", higher_is_better=False,
                                 quality={"orchard": {"loopback MB": lo_more}, "peer": {"loopback MB": lo_one}})))
    return out


def test_amdahls_two_terms_come_back_from_exact_points():
    s, w = sm.fit_amdahl({1: 10.0, 2: 6.0, 4: 4.0})
    assert (s, w) == (pytest.approx(2.0), pytest.approx(8.0))
    s, w = sm.fit_amdahl({1: 10.0, 2: 4.0})  # better than linear: S below zero, kept as measured
    assert s == pytest.approx(-2.0) and w == pytest.approx(12.0)
    with pytest.raises(ValueError):
        sm.fit_amdahl({2: 3.0})


def test_the_node_term_is_seconds_per_byte_crossed_and_four_nodes_cross_more():
    rows = rows_for("flower", {1: 10.0, 2: 6.0}, two_nodes=(6.0, 7.0, 5.0, 105.0))
    assert sm.worker_points(rows) == {"flower": {1: 10.0, 2: 6.0}}
    cost = sm.node_costs(rows)["flower"]
    assert cost["extra_mb"] == 100.0 and cost["s_per_mb"] == pytest.approx(0.01)
    assert sm.four_nodes(cost) == pytest.approx(6.0 + 1.0 * 1.5)


def test_the_seed_projection_reads_the_serial_part_both_ways():
    shape = {"examples": 32_000, "offsets": 200, "thresholds": 20, "depth": 10, "classes": 31}
    rows = sm.seed_projection(1.5, 3.0, shape)
    assert [r["workers"] for r in rows] == [64, 128, 256]
    for r in rows:  # a serial part that grows with the histogram keeps far fewer workers busy
        assert r["S per histogram cell"] < r["S per round"] <= r["workers"]
    assert sm.seed_projection(0.0, 3.0, shape)[0]["S per round"] == pytest.approx(64)


def test_the_tables_check_a_bigger_machine_and_project_the_forest(tmp_path):
    machine = {"cores": 2}
    common = {"machine": machine, "started_utc": "2026-11-28T00:00:00+00:00", "load": {"loaded": False}}
    (tmp_path / "scaling.json").write_text(json.dumps({**common, "rows": [
        *rows_for("forest", {1: 10.0, 2: 6.0}, two_nodes=(6.0, 6.5, 1.0, 51.0)), *rows_for("singa", {1: 4.0, 2: 3.0})]}))
    (tmp_path / "scaling_16c.json").write_text(json.dumps({**common, "machine": {"cores": 16}, "rows": [
        *rows_for("forest", {1: 10.0, 16: 2.5}), *rows_for("singa", {1: 4.0, 16: 9.0})]}))
    text = sm.tables(tmp_path)
    forest = next(line for line in text.splitlines() if line.startswith("| forest |"))
    # S = 2, W = 8: 16 workers predicted 2.5 s, as measured; 2 nodes cost 0.5 s for 50 MB
    assert "| 2.00 s | 8.00 s | 2.50 s / 4.00x |" in forest and "10.00 ms/MB (50 MB)" in forest
    assert "16 workers: 2.50 s predicted, 2.50 s measured (scaling_16c.json)" in forest
    singa = next(line for line in text.splitlines() if line.startswith("| singa |"))
    assert "(**miss**)" in singa and "| no row |" in singa
    assert "forest at the seed's scale" in text and "| 256 |" in text


def test_docs_scaling_md_holds_what_the_model_makes_of_the_results_file():
    """The tables between the markers in docs/scaling.md are bench.scaling_model's of today's
    results files (python -m bench.scaling_model --write puts them there)."""
    assert sm.block() == sm.tables()
