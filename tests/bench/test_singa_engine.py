"""bench/singa_engine.py's sides: the layer engine and torch autograd train the same mlp to a test
accuracy worth comparing; the architectures' rows come from real worker groups; and the bytes a
partitioned group's node actors send are the bytes the one-process net counts."""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_engine_and_torch_both_learn_the_digits():
    from bench.singa_engine import engine_vs_torch

    got = engine_vs_torch(1, 64)
    assert got["engine_test_accuracy"] > 0.5 and got["torch_test_accuracy"] > 0.3, got   # chance: 0.1
    assert got["engine_images_per_s"] > 0 and got["torch_images_per_s"] > 0 and got["ratio"] > 0


@pytest.mark.slow
def test_two_groups_train_the_mlp_and_report_their_traffic(ray_session):
    from bench.singa_engine import architectures

    rows = architectures(1, ["local", "allreduce"])
    assert rows["local"]["comm_mb_per_step"] == 0 < rows["allreduce"]["comm_mb_per_step"]
    assert all(r["images_per_s"] > 0 and r["test_accuracy"] > 0.5 for r in rows.values()), rows


@pytest.mark.slow
def test_partitioned_node_actors_send_exactly_the_bytes_the_net_counts(ray_session):
    from bench.singa_engine import partition_traffic

    for scheme, p in partition_traffic(1).items():
        assert abs(p["sent_bytes_per_step"] - p["bridge_bytes_per_step"]) < 1, (scheme, p)
        assert p["one_process_ms"] > 0 and p["actors_ms"] > 0
