"""orchard/storage/location.py: one storage location, a folder by default or an S3 bucket (a real moto
server on 127.0.0.1), read from Ray tasks through storage and cached once per node."""
from __future__ import annotations

import time

import pytest

from orchard.storage import run_kept, Storage


def test_default_root_is_output_dir_and_a_run_folder_is_the_drivers(tmp_path):
    run_id = "0123456789abcdef0123456789abcdef"  # orchard's run folders are named by the MLflow run id
    cfg = {"output_dir": str(tmp_path / "out"), "storage": {"uri": None}, "workload": {"name": "flower"}}
    assert Storage.root(cfg).uri == str((tmp_path / "out").resolve())
    run = Storage.for_run(cfg, tmp_path / "out" / "flower" / run_id)
    assert run.is_local and run.local_path == (tmp_path / "out" / "flower" / run_id).resolve()
    assert not run_kept(cfg, f"/elsewhere/flower/{run_id}")
    run.write_json("workers/rank0.json", {"rank": 0})
    assert run_kept(cfg, f"/elsewhere/flower/{run_id}")  # found by the run folder's name, not the driver's path
    assert run.list("workers") == ["rank0.json"] and run.read_json("workers/rank0.json") == {"rank": 0}
    assert run.localize("workers") == run.local_path / "workers"  # a local root is used in place
    cfg["storage"]["uri"] = "s3://bucket/prefix/"
    assert Storage.for_run(cfg, f"/x/flower/{run_id}").uri == f"s3://bucket/prefix/flower/{run_id}"


def test_run_folders_the_user_named_alike_never_share_a_storage_folder(tmp_path):
    """hydra.run.dir=.../A/exp and .../B/exp: same last name, two runs, two storage folders; the
    key comes from the path alone, so a resume from another directory finds the same one."""
    from orchard.storage import run_key

    cfg = {"output_dir": str(tmp_path / "out"), "storage": {"uri": None}, "workload": {"name": "flower"}}
    a, b = Storage.for_run(cfg, tmp_path / "A" / "exp"), Storage.for_run(cfg, tmp_path / "B" / "exp")
    assert a != b and a.uri.startswith(str((tmp_path / "out" / "flower" / "exp-").resolve()))
    assert run_key(cfg, tmp_path / "A" / "exp") == run_key(cfg, str(tmp_path / "A" / "exp"))


def test_the_previous_run_storage_is_where_the_run_named_by_resume_wrote_and_none_without_one(tmp_path):
    """ctx.previous_storage (Storage.previous_run): built once from the workload section's resume
    key, in the bucket when storage.uri is one; a checkpoint file on this machine has no run storage."""
    run_id = "0123456789abcdef0123456789abcdef"
    cfg = {"output_dir": str(tmp_path / "out"), "storage": {"uri": "s3://bucket/p"}, "workload": {"name": "singa"},
           "singa": {"resume": None}}
    assert Storage.previous_run(cfg) is None
    cfg["singa"]["resume"] = f"/gone/driver/singa/{run_id}"  # the driver's folder need not exist
    assert Storage.previous_run(cfg) == Storage.for_run(cfg, cfg["singa"]["resume"])
    assert Storage.previous_run(cfg).uri == f"s3://bucket/p/singa/{run_id}"
    checkpoint = tmp_path / "forest_checkpoint.npz"
    checkpoint.write_bytes(b"npz")
    cfg.update(workload={"name": "forest"}, forest={"resume": str(checkpoint)})
    assert Storage.previous_run(cfg) is None


def test_a_storage_travels_into_a_ray_task_as_its_uri(ray_session, tmp_path):
    store = Storage(tmp_path / "s")
    store.write_text("a/b.txt", "hello")

    @ray_session.remote(num_cpus=0)
    def read(s: Storage) -> str:
        return s.read_text("a/b.txt")

    assert ray_session.get(read.remote(store)) == "hello"


def test_s3_folder_upload_ready_and_one_copy_per_node(s3_env, monkeypatch, tmp_path):
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ORCHARD_NODE_CACHE", str(tmp_path / "node"))
    store = Storage("s3://orchard/test-storage")
    local = tmp_path / "field"
    (local / "images").mkdir(parents=True)
    (local / "images" / "a.png").write_bytes(b"\x89PNG-a")
    (local / "points.csv").write_text("image,x,y\n")
    assert not store.ready("field")
    store.upload(local, "field")
    assert store.ready("field")  # _COMPLETE is written last
    assert store.child("field").list("images") == ["a.png"]
    copy = store.localize("field")
    assert copy.parent == tmp_path / "node" and (copy / "images" / "a.png").read_bytes() == b"\x89PNG-a"
    assert store.localize("field") == copy  # the second read on this node is the cached copy
    store.delete("field")
    assert not store.exists("field")


def test_unwritable_storage_is_one_line_before_anything_starts(s3_env, monkeypatch):
    from orchard import ConfigError
    from orchard.storage import check

    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    check({"storage": {"uri": "s3://orchard/ok"}})  # writable: no error
    with pytest.raises(ConfigError) as err:
        check({"storage": {"uri": "s3://no-such-bucket-here/x"}})
    assert str(err.value).startswith("storage.uri") and "\n" not in str(err.value)


def test_single_files_by_uri_keep_their_stem_side_by_side_on_the_node(s3_env, monkeypatch, tmp_path):
    from orchard.storage import file_exists, is_uri, read_file, write_file

    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ORCHARD_NODE_CACHE", str(tmp_path / "node"))
    assert is_uri("s3://orchard/x") and not is_uri(tmp_path) and not is_uri(f"file://{tmp_path}")
    write_file("s3://orchard/files/ckpt.npz", b"state")
    assert file_exists("s3://orchard/files/ckpt.npz") and read_file("s3://orchard/files/ckpt.npz") == b"state"
    assert not file_exists("s3://orchard/files/none.npz")
    folder = Storage("s3://orchard/files")
    folder.write_bytes("000001_depth.png", b"d")
    folder.write_bytes("000001_labels.png", b"l")
    depth, labels = folder.local_copy("000001_depth.png"), folder.local_copy("000001_labels.png")
    assert depth.parent == labels.parent and depth.read_bytes() == b"d" and labels.read_bytes() == b"l"


def test_an_object_key_that_leads_out_of_the_folder_is_refused_and_leaves_nothing(s3_env, monkeypatch, tmp_path):
    """Whoever can write the shared bucket must not write files outside the node cache of
    everyone who reads from it: a planted ``..`` key is refused, naming it; no half copy stays."""
    from orchard.storage import UnsafeKey

    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ORCHARD_NODE_CACHE", str(tmp_path / "cache"))
    shared = Storage("s3://orchard/trust")
    shared.write_text("tiles/a.txt", "fine")
    import boto3  # a key as a teammate's (or an attacker's) S3 client writes it, unnormalized

    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").put_object(Bucket="orchard", Key="trust/tiles/../../escaped/PWNED.txt",
                                                     Body=b"planted")
    with pytest.raises(UnsafeKey, match=r"\.\./\.\./escaped/PWNED\.txt"):
        shared.localize("tiles")
    assert not list(tmp_path.rglob("PWNED.txt"))
    assert not [p for p in (tmp_path / "cache").rglob("*") if ".tmp-" in p.name]  # no half copy left
    with pytest.raises(UnsafeKey):
        shared.local_copy("../../escaped/PWNED.txt")


def test_a_storage_uri_with_a_query_string_is_refused_before_ray_starts(tmp_path, capsys):
    """pyarrow takes ``?endpoint_override=...&region=...``, but every run folder is a path joined onto
    storage.uri: the query would end up inside it and the run fail mid-way. One line, exit 2, instead
    (its values masked: a query may carry a key)."""
    from orchard import cli

    with pytest.raises(SystemExit) as ended:
        cli.main(["workload=forest", "tracking=none", f"output_dir={tmp_path}",
                  "storage.uri='s3://bucket/p?endpoint_override=localhost:9000&secret_key=SK-not-shown'"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "storage.uri: a URI without a query string" in err
    assert "AWS_ENDPOINT_URL" in err and "SK-not-shown" not in err


def test_an_experiment_on_a_team_server_keeps_its_artifacts_on_the_server_not_the_first_users_disk(tmp_path):
    """``tracking.artifact_location=./mlartifacts`` (the default) means this machine's folder: right
    for a sqlite store (made 0700), wrong for a server every teammate logs to (its own root then)."""
    import os
    import stat

    from orchard.tracking.mlflow_run import artifact_root

    assert artifact_root("http://127.0.0.1:5000", "./mlartifacts") is None
    assert artifact_root("https://mlflow.team", "s3://bucket/art") == "s3://bucket/art"
    local = artifact_root(f"sqlite:///{tmp_path}/m.db", str(tmp_path / "art"))
    assert local == (tmp_path / "art").as_uri() and stat.S_IMODE(os.stat(tmp_path / "art").st_mode) == 0o700
    assert artifact_root(f"sqlite:///{tmp_path}/m.db", None) is None


def test_an_upload_takes_the_folders_own_files_never_what_a_link_points_at(tmp_path):
    """A run folder may hold links (to a dataset, or planted: to ~/.ssh): an upload copies the
    folder's regular files only, and walks no linked folder."""
    secret = tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_ed25519").write_text("PRIVATE KEY")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "epoch_1.pt").write_bytes(b"weights")
    (run / "key").symlink_to(secret / "id_ed25519")
    (run / "ssh").symlink_to(secret, target_is_directory=True)
    store = Storage(str(tmp_path / "bucket"))
    store.upload(run, "r")
    kept = sorted(p.relative_to(tmp_path / "bucket" / "r").as_posix() for p in (tmp_path / "bucket" / "r").rglob("*")
                  if p.is_file())
    assert kept == ["_COMPLETE", "checkpoints/epoch_1.pt"]


def test_an_object_write_cut_by_a_signal_leaves_the_previous_object_whole(s3_env, monkeypatch):
    """Arrow publishes what a cut stream held when it closes it: a Ctrl-C mid-write of a
    checkpoint left an empty object under the checkpoint's name (a two-node singa run's resume
    then read 0 bytes). The write is cut here inside the stream; the old checkpoint stays."""
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    store = Storage("s3://orchard/test-cut-write")
    store.write_bytes("run/checkpoint.npz", b"epoch 1")
    fs, _ = store._fs_path()

    class CutStream:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            return self

        def write(self, data):
            raise KeyboardInterrupt  # Ctrl-C before a byte is written

        def __exit__(self, *exc):
            self.stream.close()  # what Arrow does with a stream it drops: it publishes it

    class CutFs:
        def __getattr__(self, name):
            return getattr(fs, name)

        def open_output_stream(self, path):
            return CutStream(fs.open_output_stream(path))

    base = store._fs_path()[1]
    monkeypatch.setattr(store, "_fs_path", lambda rel="": (CutFs(), f"{base}/{rel}".rstrip("/")))
    with pytest.raises(KeyboardInterrupt):
        store.write_bytes("run/checkpoint.npz", b"epoch 2")
    assert store.read_bytes("run/checkpoint.npz") == b"epoch 1"
    assert store.list("run") == ["checkpoint.npz"]  # and nothing half-written beside it


def test_a_storage_endpoint_that_never_answers_is_one_line_within_the_probes_wait(monkeypatch):
    """An S3 endpoint that takes the connection and says nothing (pyarrow's client retries it,
    and a GCS bucket off Google's network, for many minutes, deaf to Ctrl-C): refused once the
    probe's wait is over, its thread left behind as a daemon."""
    import socket
    import threading

    from orchard import ConfigError
    from orchard.storage import check, location

    monkeypatch.setattr(location, "PROBE_WAIT_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}", "AWS_ACCESS_KEY_ID": "t",
                           "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        started = time.monotonic()
        with pytest.raises(ConfigError) as err:
            check({"storage": {"uri": "s3://orchard/x"}})
        assert time.monotonic() - started < 5
    assert str(err.value) == ("storage.uri: a location orchard can write; 's3://orchard/x' did not answer within 1 s "
                              "(the bucket, its credentials, the network)")
    assert all(t.daemon for t in threading.enumerate() if t.name == "orchard-storage-check")
