"""bench/forest_vs_peers.py's own code: a peer over its time limit, the printed profile, peers
refused where their matrix outgrows memory, and which peer orchard is held to."""
from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_peer_over_the_time_limit_is_stopped_and_becomes_a_failed_row_with_its_memory():
    """A system still running after the bench's limit (or killed by the kernel for memory) is
    measured in the bench's own process: stopped, its peak memory kept, its error a row; the
    bench goes on instead of waiting for a result that never comes."""
    import shutil

    from bench.forest_vs_peers import SMOKE, measure_one, prepare

    cfg, data_dir, _, _ = prepare(SMOKE)
    try:
        out = measure_one("sklearn RF", cfg, data_dir, limit_s=0.5)  # spawn + imports alone take longer
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    assert out["error"] == "stopped: still training after 0 min" and out["stopped_after_s"] == 0.5
    assert out["peak_bytes"] > 10 * 2**20                              # sampled from outside the child


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_forest_bench_script_prints_the_table_and_orchards_profile_per_round(capsys):
    """`python bench/forest_vs_peers.py --profile` (the command docs/benchmarks/forest.md gives):
    orchard's time per round and phase, then the side-by-side table, limited to the systems asked."""
    from bench.forest_vs_peers import main

    main(["--shape", "smoke", "--systems", "sklearn ExtraTrees", "--profile"])
    out = capsys.readouterr().out
    assert "| tree | depth | frontier | batches | bin cache | phase 1 |" in out
    profile = [line for line in out.splitlines() if line.startswith("| 0 | ")]
    assert len(profile) >= 2                                   # one line per round of the one tree
    assert "orchard vs sklearn ExtraTrees" in out
    assert "LightGBM" not in out and "orchard@1" not in out    # left out by --systems
    assert "load average at start:" in out and "load average at end:" in out
    with pytest.raises(SystemExit):
        main(["--systems", "CatBoost"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_where_the_peers_matrix_outgrows_memory_they_are_refused_and_orchard_trains_within_its_budget(monkeypatch):
    """issue 34's beyond-memory row: a peer whose float32 matrix exceeds this machine's memory is
    not started; its row says why and carries orchard's time, accuracy and its memory bound, which
    is decided on one repeat (a bound orchard kept or not, not a timing)."""
    import psutil

    from bench import forest_vs_peers as fvp
    from bench.render import decided
    from bench.rows import summarize

    total = psutil.virtual_memory().total
    assert fvp.refusal(total // 2) is None
    assert fvp.refusal(2 * total).startswith("refused before start: its feature matrix (")
    monkeypatch.setattr(fvp, "refusal", lambda matrix_bytes: "refused before start: (as if) too big")
    size = {**fvp.SIZES["smoke"], "scaling": False, "variants": [], "memory_budget_gib": 12}
    rows = [summarize(r) for r in fvp.measure(size, 1)]
    refused = [r for r in rows if r["status"] == "refused before start: (as if) too big"]
    assert {r["name"] for r in refused} == {f"smoke: orchard vs {p}" for p in fvp.PEERS}
    for r in refused:
        assert len(r["orchard"]["values"]) == 1 and r["peer"]["values"] == []
        assert r["quality"]["orchard"]["class acc"] > 0 and "effective parallelism, run" in r["quality"]["orchard"]
        assert r["target_met"] is True and decided(r) == "met (n=1)"      # a smoke run stays far under 12 GiB


def test_the_fastest_peer_is_the_fastest_at_orchards_class_accuracy_or_above():
    """issue 34, Must-have 1: the peer orchard must beat by 1.25x is the fastest of those whose
    class accuracy is within 0.01 of orchard's or above; a faster, less accurate one does not count."""
    from bench.forest_vs_peers import fastest_peer, most_accurate_peer

    def runs(acc, seconds):
        return [{"acc": (0.6, acc), "train_s": seconds, "matrix_s": 1.0}]

    orchard = runs(0.48, 10.0)
    all_runs = {"orchard": orchard, "XGBoost rf": runs(0.475, 20.0), "LightGBM rf": runs(0.50, 30.0),
                "sklearn ExtraTrees": runs(0.43, 5.0)}
    assert fastest_peer(all_runs, {}, orchard) == "XGBoost rf"
    assert fastest_peer(all_runs, {"XGBoost rf": "died"}, orchard) == "LightGBM rf"
    assert fastest_peer({"orchard": orchard, "sklearn ExtraTrees": runs(0.43, 5.0)}, {}, orchard) is None
    # then the row holds orchard to the same ratio against the most accurate peer
    assert most_accurate_peer({**all_runs, "LightGBM rf": runs(0.41, 30.0)}, {}) == "XGBoost rf"
    assert most_accurate_peer(all_runs, {"LightGBM rf": "died", "XGBoost rf": "died"}) == "sklearn ExtraTrees"
