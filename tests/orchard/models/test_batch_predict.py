"""orchard/models/batch_predict.py on its own, without Ray: which inputs a predict run takes, the tables
and counts ``report`` writes (and logs to a real sqlite store), what a predictor's outputs may
write on the way back, and a batch whose every input vanished (no actor pool to start); and the
skeleton every workload's ``predict`` takes, once, on the session's Ray. The actor pool over real
inputs (staging, companions, files that vanish one by one): test_models.py on the session's Ray."""
import csv
import io

import numpy as np
import pytest

from orchard.models import batch_predict


class Ctx:
    """What ``predict_files`` and ``report`` use of a RunContext."""

    def __init__(self, run_dir, run_id=None, tracking_uri=None):
        self.run_dir, self.run_id, self.tracking_uri = run_dir, run_id, tracking_uri
        self.marked = []

    def progress(self, *args, **rates):
        pass

    def mark(self, part):  # the time split's parts, in order
        self.marked.append(part)


def rows_of(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_inputs_are_the_file_named_or_the_folders_files_of_the_wanted_kinds_by_name(tmp_path):
    for name in ("b.PNG", "a.png", "c.jpg", ".hidden.png", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub.png").mkdir()   # a folder, whatever its name
    assert [p.name for p in batch_predict.input_files(tmp_path, (".png", ".jpg"))] == ["a.png", "b.PNG", "c.jpg"]
    assert batch_predict.input_files(tmp_path / "notes.txt", (".png",)) == [tmp_path / "notes.txt"]  # named: taken
    assert len(batch_predict.input_files(tmp_path, ())) == 4   # no kinds given: every visible file


def test_the_predictions_table_has_the_file_names_and_rounded_figures_and_the_skipped_their_reasons(tmp_path, capsys):
    out = batch_predict.output_dir(Ctx(tmp_path))
    rows = [{"path": "/in/a.png", "error": "", "count": 3, "score": 0.123456789},
            {"path": "/in/b.png", "error": "not an image", "count": 0, "score": 0.0}]
    metrics = batch_predict.report(rows, ["path", "count", "score"], Ctx(tmp_path), out, "images", elapsed_s=2.0)
    assert out == tmp_path / "predictions"
    assert rows_of(out / "predictions.csv") == [{"file": "a.png", "count": "3", "score": "0.123457"}]
    assert rows_of(out / "skipped.csv") == [{"file": "b.png", "reason": "not an image"}]
    assert metrics == {"predict/images": 1.0, "predict/skipped": 1.0, "predict/images_per_s": 0.5}
    assert capsys.readouterr().err == "orchard: skipped b.png: not an image\n"


def test_many_skipped_files_are_twenty_lines_and_a_count_but_all_of_them_in_the_table(tmp_path, capsys):
    out = batch_predict.output_dir(Ctx(tmp_path))
    rows = [{"path": "/in/good.png", "error": ""}] + [{"path": f"/in/{i:02d}.png", "error": "bad"} for i in range(25)]
    batch_predict.report(rows, ["path"], Ctx(tmp_path), out, "images", 1.0)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 21 and lines[-1] == "orchard: ... and 5 more skipped (predictions/skipped.csv)"
    assert len(rows_of(out / "skipped.csv")) == 25


def test_a_tracked_predict_run_keeps_its_predictions_folder_as_an_artifact(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import check_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("p", (tmp_path / "art").as_uri())).info.run_id
    ctx = Ctx(tmp_path / "run", run_id, uri)
    out = batch_predict.output_dir(ctx)
    (out / "labels").mkdir()
    (out / "labels" / "a.png").write_bytes(b"png")
    batch_predict.report([{"path": "/in/a.png", "error": ""}], ["path"], ctx, out, "images", 1.0)
    logged = {a.path for a in client.list_artifacts(run_id, "predictions")}
    assert logged == {"predictions/labels", "predictions/predictions.csv"}


def test_what_a_predictor_writes_comes_back_under_the_output_folder_and_nowhere_else(tmp_path):
    """An actor packs what its predictor wrote (and empties its scratch folder for the next input);
    the driver writes it here, and a name that climbs out of the folder is dropped."""
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    (scratch / "labels").mkdir(parents=True)
    (scratch / "labels" / "a.png").write_bytes(b"\x89PNG")
    out.mkdir()
    packed = batch_predict._pack_outputs(scratch)
    assert [p for p in scratch.rglob("*") if p.is_file()] == []
    batch_predict._write_outputs(packed, out)
    assert (out / "labels" / "a.png").read_bytes() == b"\x89PNG"
    buf = io.BytesIO()
    np.savez(buf, **{"../escaped.txt": np.frombuffer(b"x", np.uint8)})
    batch_predict._write_outputs(buf.getvalue(), out)
    assert not (tmp_path / "escaped.txt").exists()


def test_a_batch_whose_every_input_vanished_is_all_skipped_rows_and_leaves_nothing_staged(tmp_path):
    """Nothing left to predict: no actor pool is started, and the staged model copy is gone."""
    from orchard.storage import Storage

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "MLmodel").write_text("flavors: {}\n")
    files = [tmp_path / "gone-1.png", tmp_path / "gone-2.png"]   # listed, then removed
    store = Storage(tmp_path / "store")
    rows = batch_predict.predict_files(files, object, {}, Ctx(tmp_path), store, tmp_path / "model", tmp_path / "out")
    assert [(r["path"], r["kind"]) for r in rows] == [(str(files[0]), "missing"), (str(files[1]), "missing")]
    assert all(r["error"].startswith("not staged: ") for r in rows)
    assert not store.exists(batch_predict.STAGING_DIR)
    with pytest.raises(Exception, match="readable images; none of the 2 file"):
        batch_predict.report(rows, ["path"], Ctx(tmp_path), batch_predict.output_dir(Ctx(tmp_path)), "images", 1.0)


@pytest.mark.slow
def test_the_predict_skeleton_checks_the_settings_file_predicts_counts_the_skipped_and_hands_back_the_rest(
        ray_session, tmp_path):
    """``predict_inputs``, what the four workloads' ``predict`` share: ``model=`` resolved, the
    plan given its metadata and ``input``, its one settings file handed to the predictor, the
    unreadable inputs counted by kind, predictions.csv written; the good rows come back."""
    import cv2

    from orchard.storage import Storage
    from tests.orchard.models.test_models import _forest_model
    from workloads.forest.predict import Predictor, SETTINGS_FILE

    class RunCtx(Ctx):
        logged: dict = {}
        storage = Storage(tmp_path / "store")

        def log_metrics(self, metrics, step=None):
            self.logged.update(metrics)

        def log_text(self, text, name):
            self.logged[name] = text

    model = _forest_model(tmp_path)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(3):
        cv2.imwrite(str(inputs / f"d{i}.png"), np.full((16, 12), 1000, np.uint16))
    (inputs / "broken.png").write_bytes(b"not a png")
    seen = []

    def plan(meta, source):
        seen.append(source)
        return batch_predict.Plan(SETTINGS_FILE, Predictor, batch_predict.input_files(source, (".png",)),
                                  ["path", "width", "height"], "images", subdir="labels", batch_size=2)

    ctx = RunCtx(tmp_path / "run")
    out = batch_predict.output_dir(ctx)
    done = batch_predict.predict_inputs({"model": str(model), "input": str(inputs)}, ctx, out, "forest", plan)
    assert seen == [inputs] and done.source == inputs
    assert sorted(r["path"].rsplit("/", 1)[1] for r in done.good) == ["d0.png", "d1.png", "d2.png"]
    assert done.metrics["predict/images"] == 3 and done.metrics["predict/skipped"] == 1
    assert ctx.logged["data/skipped_files"] == 1 and "broken.png" in ctx.logged["skipped.csv"]
    assert len(rows_of(out / "predictions.csv")) == 3 and len(list((out / "labels").glob("*.png"))) == 3
    assert ctx.marked == ["model", "data", "predict"]  # where the run's seconds went (its time split)
