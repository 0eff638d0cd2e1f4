"""Each workload's pydantic schema (workloads/<name>/schema.py): a bad type or range is one line
naming the key, what is allowed and the value given, before Ray starts; the schema and the
workload's config file name the same keys.  Composition only, no Ray."""
import importlib

import pytest

from orchard import ConfigError
from orchard.run.lifecycle import prepare

SCHEMAS = {"forest": ["Forest"], "flower": ["Flower"], "video": ["Video", "Synthetic"], "singa": ["Singa"]}
SECTIONS = {"Synthetic": "synthetic"}  # models that check one section of the workload's keys


@pytest.mark.parametrize("overrides,key,line", [
    (["workload=forest", "forest.actors_per_worker=2"], "forest.actors_per_worker", "a fraction in [0, 1], got 2"),
    (["workload=flower", "flower.sigma=true"], "flower.sigma", "a positive number, got True"),
    (["workload=flower", "flower.tile_size=10"], "flower.tile_size", "a positive multiple of 4"),
    (["workload=flower", "flower.roi=[0,0,5]"], "flower.roi",
     "null or [x, y, width, height] (width and height > 0), got [0, 0, 5]"),
    (["workload=flower", "flower.roi=[0,0,0,64]"], "flower.roi", "got [0, 0, 0, 64]"),
    (["workload=flower", "flower.optimizer.lr=0"], "flower.optimizer.lr", "a positive number, got 0"),
    (["workload=flower", "flower.eval_device=gpu"], "flower.eval_device", "auto, cpu or cuda[:index], got 'gpu'"),
    (["workload=flower", "flower.loader_threads='4'"], "flower.loader_threads", "or a positive integer, got '4'"),
    (["workload=video", "video.size=33"], "video.size", "an even size >= 16 pixels, got 33"),
    (["workload=video", "video.pause_decode=1"], "video.pause_decode", "true or false, got 1"),
    (["workload=video", "video.inference.method=mean"], "video.inference.method",
     "one of winner, avg, max, topk, linear, attention, got 'mean'"),
    (["workload=video", "video.synthetic.num_classes=10"], "video.synthetic.num_classes",
     "2..9 motion classes, got 10"),
    (["workload=video", "video.decode_cpus=0"], "video.decode_cpus", "a CPU share in (0, 64], got 0"),
    (["workload=singa", "singa.epochs=0"], "singa.epochs", "a positive integer, got 0"),
    (["workload=singa", "singa.target_accuracy=2"], "singa.target_accuracy", "a fraction in (0, 1], got 2"),
    (["workload=singa", "singa.updater=rmsprop"], "singa.updater", "sgd, adagrad, adam, got 'rmsprop'"),
    (["workload=singa", "singa.cluster.sample_ratio=0"], "singa.cluster.sample_ratio", "a fraction in (0, 1], got 0"),
    (["workload=singa", "singa.cluster.worker_groups=0"], "singa.cluster.worker_groups", "a positive integer, got 0"),
])
def test_a_bad_value_is_one_line_naming_the_key_and_what_is_allowed(overrides, key, line, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started for a bad config"))
    with pytest.raises(ConfigError) as err:
        prepare(overrides)
    assert err.value.key == key
    assert line in str(err.value) and "\n" not in str(err.value)


def test_a_synthetic_setting_is_not_checked_when_real_videos_are_given(compose, tmp_path):
    from workloads import video

    with pytest.raises(ConfigError) as err:
        video.validate(compose("workload=video", "video.synthetic.num_frames=1"))
    assert err.value.key == "video.synthetic.num_frames"
    with pytest.raises(ConfigError) as err:  # the folder is checked instead: it has no classes
        video.validate(compose("workload=video", "video.synthetic.num_frames=1", f"video.root={tmp_path}"))
    assert err.value.key == "video.root"


@pytest.mark.parametrize("workload", sorted(SCHEMAS))
def test_every_key_a_schema_checks_is_in_the_workloads_config(compose, workload):
    """A key renamed in conf/workload/<name>.yaml but not in the schema would be 'missing from
    the config' on every run: each field the schema names is one the shipped config has."""
    module = importlib.import_module(f"workloads.{workload}.schema")
    config = compose(f"workload={workload}")[workload]
    for name in SCHEMAS[workload]:
        model = getattr(module, name)
        section = config[SECTIONS[name]] if name in SECTIONS else config
        _assert_keys(model, section, f"{workload}.{SECTIONS.get(name, '')}".rstrip("."))


def _assert_keys(model, section: dict, prefix: str) -> None:
    for key, field in model.model_fields.items():
        assert key in section, f"{prefix}.{key}: in {model.__name__} but not in the config"
        if hasattr(field.annotation, "model_fields"):
            _assert_keys(field.annotation, section[key], f"{prefix}.{key}")
