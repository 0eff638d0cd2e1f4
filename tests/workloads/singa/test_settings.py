"""workloads/singa/settings.py: a user's own layers and nets (issue 16): ``singa.net`` + ``singa.layer_modules`` from the CLI
under the distributed architectures, and nets checked before anything starts (one line naming
the layer, exit 2)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import workloads.singa as singa
from orchard import config
from orchard.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "user_layers"
USER_NET = FIXTURES / "user_mlp.yaml"
# In the test session Ray's workers import from the repo root (orchard.cluster.prepare_local_env),
# so the fixture package goes by its dotted path here; the CLI check uses PYTHONPATH instead.
USER_MODULE = "tests.fixtures.user_layers.singa_user_layers"
MLP = yaml.safe_load((ROOT / "conf" / "singa" / "apps" / "mlp.yaml").read_text())


def checked(cfg: dict) -> None:
    """What a run checks before it opens: the keys (``validate``, before Ray starts), then the
    net built on two samples (``check``, while Ray starts)."""
    config.validate(cfg, singa)
    config.check(cfg, singa)


def net_with(tmp_path, edit, name="net.yaml") -> str:
    """The mlp app's net with ``edit(layers_by_name, layers)`` applied, written to a file."""
    net = yaml.safe_load(yaml.safe_dump(MLP))
    edit({c["name"]: c for c in net["layers"]}, net["layers"])
    path = tmp_path / name
    path.write_text(yaml.safe_dump(net, sort_keys=False))
    return str(path)


def _cycle(by, layers):
    by["fc1"]["srclayers"] = ["mnist", "fc2"]


def _long_cycle(by, layers):
    layers.insert(4, {"name": "mix", "type": "concat", "srclayers": ["fc1", "fc3"], "dim": 1})
    by["fc2"]["srclayers"] = "mix"


def _unknown(by, layers):
    by["fc3"]["type"] = "no_such_layer"


def _missing(by, layers):
    by["loss"]["srclayers"] = ["fc6"]


def _extra(by, layers):
    by["fc6"]["srclayers"] = ["fc5", "mnist"]


def _shape(by, layers):
    layers.append({"name": "rec", "type": "euclidean_loss", "srclayers": ["fc5", "mnist"]})


def _conv_on_vector(by, layers):
    by["fc2"].update(type="convolution", num_filters=4, kernel=3)


def _no_source(by, layers):
    by["fc4"]["srclayers"] = "fc9"


@pytest.mark.parametrize("edit,layer,words", [
    (_cycle, "fc1", "cycle"),
    (_long_cycle, "fc2", "cycle"),
    (_unknown, "fc3", "unknown layer type 'no_such_layer'"),
    (_missing, "loss", "missing a source"),
    (_extra, "fc6", "extra source"),
    (_shape, "rec", "differ in size"),
    (_conv_on_vector, "fc2", "(channels, height, width)"),
    (_no_source, "fc4", "unknown src layer 'fc9'"),
])
def test_a_broken_net_is_one_line_naming_its_layer(compose, tmp_path, edit, layer, words):
    cfg = compose("workload=singa", f"singa.net={net_with(tmp_path, edit)}")
    with pytest.raises(ConfigError) as err:
        checked(cfg)
    message = str(err.value)
    assert err.value.key == "singa.net" and f"'{layer}'" in message and words in message, message
    assert "\n" not in message


def test_only_a_declared_rbm_pair_may_read_each_other(compose, tmp_path):
    rbm = yaml.safe_load((ROOT / "conf" / "singa" / "apps" / "rbm.yaml").read_text())
    stage = rbm["pretrain"][0]["layers"]
    assert {"v1", "h1"} <= {c["name"] for c in stage}  # v1 <-> h1 is a cycle, and allowed
    checked(compose("workload=singa", "singa.app=rbm"))
    # the same pair, with the hidden end an ordinary layer: rejected
    for c in stage:
        if c["name"] == "h1":
            c["type"] = "hidden"
    (tmp_path / "rbm.yaml").write_text(yaml.safe_dump(rbm))
    with pytest.raises(ConfigError, match="pretrain\\[0\\].*cycle"):
        checked(compose("workload=singa", f"singa.net={tmp_path / 'rbm.yaml'}"))


def test_user_layer_module_must_import(compose):
    with pytest.raises(ConfigError) as err:
        checked(compose("workload=singa", "singa.layer_modules=[no_such_pkg.layers]"))
    assert err.value.key == "singa.layer_modules" and "no_such_pkg" in str(err.value)
    with pytest.raises(ConfigError) as err:
        checked(compose("workload=singa", f"singa.net={USER_NET}"))  # types not registered yet
    assert "scaled_tanh" in str(err.value) or "swish" in str(err.value)
    checked(compose("workload=singa", f"singa.net={USER_NET}", f"singa.layer_modules=[{USER_MODULE}]"))


def test_autograd_layer_sources_come_from_its_forward():
    from workloads.singa.layers import layer_class
    from workloads.singa.layers.base import import_layer_modules, source_count

    import_layer_modules([USER_MODULE])
    assert source_count(layer_class("swish")) == (1, 1)
    assert source_count(layer_class("scaled_tanh")) == (1, 1)
    assert source_count(layer_class("concat")) == (1, None)


def test_an_entry_point_offers_layers_without_layer_modules(tmp_path, monkeypatch):
    """``[project.entry-points."orchard.singa_layers"]``: an installed package's layers resolve by
    type name alone.  A dist-info folder on sys.path is what an installed package looks like."""
    from workloads.singa.layers import base

    dist = tmp_path / "my_singa_layers-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-singa-layers\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[orchard.singa_layers]\nmine = my_ep_layers\n")
    (tmp_path / "my_ep_layers.py").write_text(
        "from workloads.singa.layers.neuron import ElementwiseLayer\n"
        "from workloads.singa.layers import register_layer\n"
        "@register_layer('ep_tanh')\nclass EpTanh(ElementwiseLayer):\n    kind = 'tanh'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(base, "_ENTRY_POINTS_LOADED", False)
    assert base.layer_class("ep_tanh").__name__ == "EpTanh"


@pytest.mark.slow
def test_cli_rejects_a_cycle_before_a_run_opens_in_one_line(tmp_path):
    """The net is built while Ray starts (``check``): after the run's first line (the config, and
    where Ray's lines go), one line naming the layer, exit 2, and no run folder."""
    path = net_with(tmp_path, _cycle)
    out = subprocess.run([sys.executable, "-m", "orchard", "workload=singa", f"singa.net={path}", "tracking=none",
                          f"output_dir={tmp_path}/out"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 2 and lines[0].startswith("orchard: workload=singa "), lines
    assert lines[1].startswith("orchard: bad config: singa.net: ") and "'fc1'" in lines[1] and "cycle" in lines[1]
    assert not (tmp_path / "out" / "singa").exists()  # no run folder: no run started


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sync_ps", "allreduce"])
def test_user_layers_and_net_train_from_the_cli(run_orchard, arch):
    result = run_orchard("workload=singa", f"singa.net={USER_NET}", f"singa.layer_modules=[{USER_MODULE}]",
                         f"singa.arch={arch}", "debug=smoke", "singa.tsne=false")
    assert result.exit_code == 0, result.outcome
    m = result.run.data.metrics
    assert m["test/accuracy"] > 0.7 and m["wire/bytes_per_step"] > 0
    assert result.run.data.params["singa.net"] == str(USER_NET)
    assert "net.yaml" in result.artifacts()


@pytest.mark.slow
@pytest.mark.parametrize("name,extra,group", [
    ("local", {"server_groups": 0, "servers_per_group": 0}, {"group_size": 2, "partition": "model"}),
    ("async_ps", {"mode": "async", "sample_ratio": 0.5}, {}),
    ("replicated", {"server_groups": 2, "servers_per_group": 1, "sync_every": 3}, {}),
])
def test_user_layers_train_under_the_other_architectures(ray_session, name, extra, group):
    """Group actors and (model-partitioned) node actors import the user's layer module."""
    from workloads.singa.architectures import Architecture

    net = yaml.safe_load(USER_NET.read_text())
    spec = {"layers": net["layers"], "algorithm": "bp", "data": "digits", "data_dir": None, "seed": 0, "smoke": True,
            "batch_size": 32, "shuffle": True, "augment": None, "group_size": 1, "partition": "none", "threads": 1,
            "updater": net["train"]["updater"], "layer_modules": [USER_MODULE], **group}
    arch = {"name": name, "worker_groups": 1 if name == "local" else 2, "workers_per_group": group.get("group_size", 1),
            "server_groups": 1, "servers_per_group": 1, "mode": "sync", "sync_every": 1, "sample_ratio": 1.0, **extra}
    machine = Architecture(arch, spec, 0.5)
    try:
        before = machine.evaluate()["loss/accuracy"]
        machine.run_steps(machine.steps_per_epoch)
        after = machine.evaluate()["loss/accuracy"]
        params, plan = machine.params(), machine.plan
    finally:
        machine.shutdown()
    assert "act1/a" in params and "act2/beta" in params  # the user layers' own parameters trained
    assert after > max(0.5, before + 0.2)
    if group:
        assert plan["fc1"] == "model" and plan["act1"] == "whole"  # a plain Layer splits by data only


def test_user_net_file_errors_are_one_line(compose, tmp_path):
    (tmp_path / "bad.yaml").write_text("layers: {not: a list}\n")
    for value, words in ((tmp_path / "missing.yaml", "cannot read"), (tmp_path / "bad.yaml", "'layers' list")):
        with pytest.raises(ConfigError, match=words) as err:
            checked(compose("workload=singa", f"singa.net={value}"))
        assert err.value.key == "singa.net"
    assert os.path.exists(USER_NET)
