"""Batch prediction for ``mode=predict``: a trained model over many files, as a Ray Data
``map_batches`` with an actor pool holding the model (streamed, so memory stays bounded). The
model and the inputs reach the actors through the run's storage (no driver path), outputs come
back packed, and ``report`` writes the run's predictions table, counts and throughput. The
model itself is resolved in orchard/models/__init__.py; the core opens the predictions folder
(orchard/config/registry.py ``entry``)."""
from __future__ import annotations

import contextlib
import csv
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from orchard.config.registry import PREDICTIONS_DIR
from orchard.errors import ConfigError
from orchard.models.logged import record_model_input


@dataclass
class Plan:
    """What one workload's ``mode=predict`` says of itself; ``predict_inputs`` does the rest, the
    same for all four: resolve ``model=``, check its one settings file, list and stage the inputs,
    run the actor pool, count the skipped files, write predictions.csv."""
    settings_file: str          # the model folder's one settings file, checked here and handed to the predictor
    predictor: type             # the Ray Data actor class: predictor(model_dir=, out_dir=, <settings_arg>=, **args)
    inputs: Iterable[Path]      # the files of ``input`` to predict (read or not: the unreadable are counted)
    columns: list[str]          # predictions.csv's columns
    unit: str                   # what a row is: "images", "videos", "files" (predict/<unit>, predict/<unit>_per_s)
    args: dict = field(default_factory=dict)
    settings_arg: str = "settings"
    trusted: tuple[str, object, str] | None = None   # (key in the settings file, cfg's list, its config key)
    subdir: str | None = None   # a folder of the predictions the predictor writes into
    companions: Callable[[Path], list[Path]] | None = None
    desc: str = "predicting"
    batch_size: int = 4
    num_gpus: float = 0.0
    source: Path | None = None  # where the inputs are, when not ``input`` itself (flower: its images/ folder)


@dataclass
class Predicted:
    """What ``predict_inputs`` hands back for the workload's own figures."""
    metrics: dict[str, float]   # predict/<unit>, predict/skipped, predict/<unit>_per_s
    good: list[dict]            # the rows of the files predicted
    elapsed_s: float
    source: Path                # ``input``, as the plan read it
    meta: dict                  # the model's metadata (MLflow's MLmodel ``metadata``)


def predict_inputs(cfg: dict, ctx, out: Path, workload: str, plan: Callable[[dict, Path], Plan]) -> Predicted:
    """``mode=predict``'s skeleton: ``model=`` resolved (its MLflow metadata handed to ``plan``
    with the ``input`` path), the plan's settings file checked once and the same file loaded, the
    inputs predicted by an actor pool into ``out`` (the predictions folder the core opened), the
    unreadable ones skipped and counted by kind (data/skipped_files, skipped.csv)."""
    from orchard.models import resolve_model, settings_file, trusted_modules
    from orchard.tracking import skipped

    model_dir, meta = resolve_model(cfg["model"], workload, ctx.tracking_uri, Path(ctx.run_dir) / "model_in")
    source = Path(cfg["input"]).expanduser()
    chosen = plan(meta, source)
    source = chosen.source or source
    settings = settings_file(model_dir, chosen.settings_file)   # one, found once: the predictor loads it
    if chosen.trusted is not None:
        trusted_modules(model_dir / settings, *chosen.trusted)
    ctx.mark("model")  # the time split's parts (docs/runs.md): the model resolved and fetched
    files, unusable = skipped.readable(chosen.inputs, source)
    if chosen.subdir:
        (out / chosen.subdir).mkdir(exist_ok=True)
    ctx.mark("data")
    started = time.perf_counter()
    rows = predict_files(files, chosen.predictor, {chosen.settings_arg: settings, **chosen.args}, ctx, ctx.storage,
                         model_dir, out, companions=chosen.companions, desc=chosen.desc, batch_size=chosen.batch_size,
                         num_gpus=chosen.num_gpus) if files else []
    rows += skipped.as_rows(unusable, source if source.is_dir() else source.parent)
    elapsed = time.perf_counter() - started
    skipped.record(ctx, skipped.from_rows(rows))
    metrics = report(rows, chosen.columns, ctx, out, chosen.unit, elapsed)
    ctx.mark("predict")  # the actor pool's pass and the predictions' table and artifacts
    return Predicted(metrics, [r for r in rows if not r["error"]], elapsed, source, meta)


def input_files(path: str | os.PathLike, suffixes: Iterable[str]) -> list[Path]:
    """The file itself, or the files directly in the folder whose suffix is one of ``suffixes``
    (case-insensitive), sorted by name.  Hidden files are left out."""
    path = Path(os.path.expanduser(str(path)))
    if path.is_file():
        return [path]
    wanted = {s.lower() for s in suffixes}
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                  and (not wanted or p.suffix.lower() in wanted))


def output_dir(ctx) -> Path:
    """``<run folder>/predictions``, written in place (a predict run writes it whole: ``predictions``)."""
    out = Path(ctx.run_dir) / PREDICTIONS_DIR
    out.mkdir(parents=True, exist_ok=True)
    return out


def predict_files(files: list[Path], predictor: type, args: dict, ctx, storage, model_dir: Path, out: Path,
                  companions: Callable[[Path], list[Path]] | None = None, desc: str = "predicting",
                  batch_size: int = 4, num_cpus: float = 1.0, num_gpus: float = 0.0) -> list[dict]:
    """Run ``predictor(model_dir=..., out_dir=..., **args)`` over ``files`` as a Ray Data
    ``map_batches`` with an actor pool holding the model (one actor per free CPU at most, or per
    ``num_gpus`` of the free GPUs when it asks for GPUs; streamed, so memory stays bounded), and
    return one row per file: ``{"path", "error", ...}`` with ``error == ""`` where it worked.
    Drives the progress line with items/s.

    The actors may run on any node, so nothing they open is a driver path: the model folder and
    the inputs (each with its ``companions``, e.g. the ground-truth file beside it) go through
    ``storage`` (the run's storage location; a local one takes hard links, no copy), and the
    files a predictor writes into its ``out_dir`` (a node-local scratch folder) come back in the
    results and are written into ``out`` here.  The predictor's ``__call__(batch)`` gets
    ``{"path": array of str}`` (node-local paths) and returns columns of the same length; it
    never raises for one bad file (it fills ``error`` instead)."""
    import numpy as np
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    record_model_input(ctx, model_dir)
    total = len(files)
    staging = storage.child(STAGING_DIR)
    started = time.perf_counter()
    lost = _stage(staging, model_dir, files, companions, ctx)   # inputs gone since they were listed
    rows: list[dict] = [{"path": str(files[i]), "error": reason, "kind": kind} for i, (kind, reason) in lost.items()]
    kept = [(i, p) for i, p in enumerate(files) if i not in lost]
    if not kept:
        with contextlib.suppress(Exception):
            staging.delete()
        return rows
    free = ray.available_resources()
    actors = int(free.get("CPU", 1) // max(num_cpus, 1e-9))
    if num_gpus > 0:
        actors = min(actors, int(free.get("GPU", 0) // num_gpus))
    pool = max(1, min(actors, -(-len(kept) // batch_size)))
    items = [{"path": str(p), "rel": _input_rel(i, p)} for i, p in kept]
    ds = ray.data.from_items(items, override_num_blocks=max(1, -(-len(kept) // batch_size)))
    subdirs = sorted(d.name for d in Path(out).iterdir() if d.is_dir())
    ds = ds.map_batches(_OnAnyNode, fn_constructor_kwargs={"predictor": predictor, "args": args,
                                                           "staging": staging, "subdirs": subdirs},
                        batch_size=batch_size, batch_format="numpy", num_cpus=num_cpus,
                        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=pool),
                        num_gpus=num_gpus)
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for i in range(len(batch["path"])):
                row = {k: (v[i].item() if isinstance(v[i], np.generic) else v[i]) for k, v in batch.items()}
                _write_outputs(row.pop("outputs"), Path(out))
                row.pop("rel", None)
                rows.append(row)
            rate = len(rows) / max(time.perf_counter() - started, 1e-9)
            ctx.progress(len(rows), total, desc=desc, **{"items/s": rate})
    finally:
        try:
            staging.delete()   # the copies are not results; the originals stay where they were
        except Exception:      # an unreachable store: leftovers, never a lost run
            pass
    order = {str(p): i for i, p in enumerate(files)}
    rows.sort(key=lambda r: order.get(str(r["path"]), 0))
    return rows


STAGING_DIR = "predict_staging"   # in the run's storage: the model and inputs the actors read


def _input_rel(i: int, path: Path) -> str:
    """Where input ``i`` sits in the staging folder: its own folder, which keeps the input's
    parent folder name (singa reads a class label from it) and holds its companions."""
    return f"inputs/{i:07d}/{Path(path).parent.name or '_'}/{Path(path).name}"


def _stage(staging, model_dir: Path, files: list[Path], companions, ctx) -> dict[int, tuple[str, str]]:
    """The model folder and every input (with its companions) into ``staging``.  Returns the
    inputs that could not be staged, ``{index in files: (kind, reason)}`` (orchard/tracking/skipped.py's
    kinds): a file removed or made unreadable since it was listed is skipped, not the run."""
    from orchard.tracking.skipped import kind_of, one_line

    staging.upload(model_dir, "model")   # small; inputs may be many and large: linked below
    lost: dict[int, tuple[str, str]] = {}
    for i, path in enumerate(files):
        rel = _input_rel(i, path)
        try:
            _put_file(staging, rel, path)
            for extra in (companions(path) if companions else []):
                _put_file(staging, f"{rel.rsplit('/', 1)[0]}/{extra.name}", extra)
        except OSError as exc:   # gone or unreadable since listed; a full disk is the run's (StorageFull)
            from orchard.storage.atomic import StorageFull, as_storage_full

            if isinstance(as_storage_full(exc, rel), StorageFull):
                raise
            lost[i] = (kind_of(exc), f"not staged: {one_line(exc)}")
            with contextlib.suppress(Exception):
                staging.delete(rel.rsplit("/", 1)[0])   # what of it was staged
        if i % 50 == 49:
            ctx.progress(i + 1, len(files), desc="staging inputs")
    return lost


def _put_file(storage, rel: str, path: Path) -> None:
    if storage.is_local:   # same machine: a hard link (a copy across file systems)
        target = storage.local_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
    else:
        storage.write_bytes(rel, Path(path).read_bytes())


def _pack_outputs(folder: Path) -> bytes:
    """Every file under ``folder`` as one ``.npz`` (names relative, bytes as uint8), then gone."""
    import io

    import numpy as np

    files = {p.relative_to(folder).as_posix(): np.frombuffer(p.read_bytes(), np.uint8)
             for p in sorted(folder.rglob("*")) if p.is_file()}
    buf = io.BytesIO()
    np.savez(buf, **files)
    for p in folder.rglob("*"):
        if p.is_file():
            p.unlink()
    return buf.getvalue()


def _write_outputs(packed: bytes, out: Path) -> None:
    import io

    import numpy as np

    with np.load(io.BytesIO(packed), allow_pickle=False) as files:
        for rel in files.files:
            target = (out / rel).resolve()
            if out.resolve() not in target.parents:   # a name that climbs out of the folder
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[rel].tobytes())


class _OnAnyNode:
    """The Ray Data actor around a workload's predictor: fetches the model and each input from
    the staging folder into this node's scratch space, runs the predictor one file at a time,
    and returns what it wrote (packed) with its row."""

    def __init__(self, predictor: type, args: dict, staging, subdirs: list[str]):
        import tempfile

        self.staging = staging
        self.scratch = Path(tempfile.mkdtemp(prefix="orchard-predict-"))
        self.out = self.scratch / "out"
        for name in subdirs:
            (self.out / name).mkdir(parents=True, exist_ok=True)
        model_dir = staging.localize("model")
        self.inner = predictor(model_dir=str(model_dir), out_dir=str(self.out), **args)

    def _local(self, rel: str) -> Path:
        if self.staging.is_local:
            return self.staging.local_path / rel
        folder = rel.split("/", 2)[:2]
        return self.staging.download("/".join(folder), self.scratch / "in" / folder[1]) / rel.split("/", 2)[2]

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        columns: dict[str, list] = {}
        for path, rel in zip(batch["path"], batch["rel"]):
            fetch_error = ""
            try:
                local = self._local(str(rel))
            except Exception as exc:  # the staged copy cannot be read: this file is skipped
                local = self.scratch / "unreadable" / Path(str(rel)).name   # the predictor's own error row
                fetch_error = f"not staged: {_one_line(exc)}"
            row = {k: v[0] for k, v in self.inner({"path": np.asarray([str(local)])}).items()}
            if fetch_error:
                row["error"] = fetch_error
            row.update(path=str(path), rel=str(rel), outputs=_pack_outputs(self.out))
            for k, v in row.items():
                columns.setdefault(k, []).append(v)
            if not self.staging.is_local:
                shutil.rmtree(self.scratch / "in", ignore_errors=True)
        return {k: np.asarray(v, dtype=object if k == "outputs" else None) for k, v in columns.items()}


def report(rows: list[dict], columns: list[str], ctx, out: Path, kind: str, elapsed_s: float,
           table: str = "predictions.csv") -> dict[str, float]:
    """Write ``predictions.csv`` (the good rows, ``columns``) and ``skipped.csv`` (file, reason),
    print one line per skipped file, log the output folder as the artifact folder
    ``predictions``, and return ``predict/<kind>``, ``predict/skipped`` and
    ``predict/<kind>_per_s``.  Raises ConfigError (exit 2) when no input could be read."""
    good = [r for r in rows if not r.get("error")]
    bad = [r for r in rows if r.get("error")]
    with open(out / table, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["file" if c == "path" else c for c in columns])
        for r in good:
            writer.writerow([Path(r[c]).name if c == "path" else _cell(r[c]) for c in columns])
    if bad:
        with open(out / "skipped.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(("file", "reason"))
            writer.writerows((Path(r["path"]).name, r["error"]) for r in bad)
        for r in bad[:20]:
            _say(f"orchard: skipped {Path(r['path']).name}: {r['error']}")
        if len(bad) > 20:
            _say(f"orchard: ... and {len(bad) - 20} more skipped (predictions/skipped.csv)")
    log_outputs(ctx, out)
    if not good:
        raise ConfigError("input", f"readable {kind}; none of the {len(rows)} file(s) could be used"
                          + (f" (first: {Path(bad[0]['path']).name}: {bad[0]['error']})" if bad else ""))
    return {f"predict/{kind}": float(len(good)), "predict/skipped": float(len(bad)),
            f"predict/{kind}_per_s": len(good) / max(elapsed_s, 1e-9)}


def log_outputs(ctx, out: Path) -> None:
    """The predictions folder as the run's artifact folder ``predictions`` (one call)."""
    if ctx.run_id and ctx.tracking_uri:
        from mlflow.tracking import MlflowClient

        MlflowClient(ctx.tracking_uri).log_artifacts(ctx.run_id, str(out), PREDICTIONS_DIR)


def _say(line: str) -> None:
    """A line on the user's terminal (orchard's console, when it holds the descriptors)."""
    try:
        from orchard.terminal.console import say
    except ImportError:  # a console without a quiet mode: plain stderr
        print(line, file=sys.stderr, flush=True)
        return
    say(line, file=sys.stderr)


def _cell(value):
    if isinstance(value, float):
        return round(value, 6)
    return value


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
