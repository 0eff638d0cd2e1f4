"""orchard/config/schema.py on its own: ``check(model, values, prefix)`` lets through what the core's
pydantic models allow and stops anything else with one ConfigError naming the dotted key, what is
allowed (the field's description) and the value given. Plain dicts, no composition (the lines as
the CLI prints them: test_config.py; the workloads' schemas: tests/workloads/test_schemas.py)."""
import pytest
from pydantic import Field

from orchard.config import schema
from orchard.errors import ConfigError

STRATEGY = {"num_workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 0, "max_failures": 0}
SWEEP = {"name": "s", "metric": "val/mae", "mode": "min", "num_samples": 2, "scheduler": "asha"}


def refusal(model, values, prefix="") -> str:
    with pytest.raises(ConfigError) as err:
        schema.check(model, values, prefix)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("values, line", [
    ({**STRATEGY, "num_workers": "2"}, "strategy.num_workers: a positive integer, got '2'"),  # strict: quoted
    ({**STRATEGY, "cpus_per_worker": True}, "strategy.cpus_per_worker: a number >= 0, got True"),
    ({**STRATEGY, "max_failures": -2}, "strategy.max_failures: an integer >= -1 (-1: retry forever), got -2"),
])
def test_a_value_of_the_wrong_type_or_range_names_the_key_what_is_allowed_and_the_value(values, line):
    assert refusal(schema.Strategy, values, "strategy") == line


def test_keys_the_schema_does_not_name_pass_and_ints_are_numbers():
    """A strategy's or workload's own keys live beside the core's; ``1`` is a fine float."""
    schema.check(schema.Strategy, {**STRATEGY, "checkpoint_every": 1, "min_workers": None}, "strategy")
    schema.check(schema.ParameterServers, {**STRATEGY, "num_servers": 1, "mode": "async"}, "strategy")


def test_a_key_missing_from_the_config_is_named_as_missing():
    values = {k: v for k, v in STRATEGY.items() if k != "max_failures"}
    assert refusal(schema.Strategy, values, "strategy") == "strategy.max_failures: missing from the config"


def test_a_nested_section_is_named_by_its_full_dotted_key():
    core = {"mode": "train", "progress": "auto", "verbose": False, "seed": 0, "strategy": STRATEGY,
            "cluster": {"mode": "local"}, "logs": {"max_mb": 1, "backups": 0}}
    schema.check(schema.Core, core)
    assert refusal(schema.Core, {**core, "logs": {"max_mb": 1, "backups": 0.5}}) == "logs.backups: an integer >= 0, got 0.5"
    assert refusal(schema.Core, {**core, "cluster": {"mode": "local", "ray_log_level": "LOUD"}}) == \
        "cluster.ray_log_level: one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'"


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "http://127.0.0.1:5000", "postgresql+psycopg2://u@h/db",
                                 "file:///tmp/mlruns", "databricks://my-profile"])
def test_every_kind_of_mlflow_store_is_a_tracking_uri(uri):
    schema.check(schema.Tracking, {"uri": uri, "sample_interval_s": 2.0}, "tracking")


def test_a_path_where_a_store_uri_belongs_and_a_cluster_without_a_port_are_refused():
    assert refusal(schema.Tracking, {"uri": "mlflow.db", "sample_interval_s": 2.0}, "tracking").startswith(
        "tracking.uri: an MLflow tracking URI such as sqlite:///mlflow.db")
    assert refusal(schema.RemoteCluster, {"mode": "remote", "address": "headnode"}, "cluster") == \
        "cluster.address: auto, ray://host:10001 or host:6379, got 'headnode'"
    schema.check(schema.RemoteCluster, {"mode": "remote", "address": "10.0.0.1:6379"}, "cluster")


def test_a_field_named_by_its_alias_is_reported_by_that_name():
    """``sweep.register`` is ``register_name`` inside (pydantic's BaseModel has a ``register``)."""
    assert refusal(schema.Sweep, {**SWEEP, "register": " "}, "sweep") == \
        "sweep.register: null or a Model Registry name for the best trial's model, got ' '"


def test_a_bad_item_of_a_list_shows_the_whole_list_under_the_lists_key():
    """The pattern a workload's own schema follows (a model per section, ``check`` in its validate)."""
    class Section(schema.Section):
        roi: list[int] = Field(description="[x, y, width, height]")
        tiles: int = schema.positive_int()

    assert refusal(Section, {"roi": [0, "a", 2], "tiles": 1}, "w") == "w.roi: [x, y, width, height], got [0, 'a', 2]"
    assert refusal(Section, {"roi": [0], "tiles": 0}) == "tiles: a positive integer, got 0"


def test_a_bad_asha_setting_says_what_is_allowed_in_the_schemas_words():
    assert refusal(schema.Sweep, {**SWEEP, "asha": {"reduction_factor": 1}}, "sweep") == \
        "sweep.asha.reduction_factor: a number > 1, got 1"


def test_mlflows_plain_databricks_uri_is_a_tracking_uri():
    schema.check(schema.Tracking, {"uri": "databricks", "sample_interval_s": 2.0}, "tracking")


def test_a_negative_seed_is_refused_before_anything_starts(capfd, tmp_path):
    """numpy's generators take no negative seed: a forest run failed in its first task (exit 1)."""
    from tests.tiny_workload.cli import main_in_process

    code, err = main_in_process(["workload=forest", "debug=smoke", "seed=-1", f"output_dir={tmp_path}"], capfd)
    assert code == 2 and err.strip() == "orchard: bad config: seed: an integer >= 0, got -1"
