"""flower on photos as cameras write them: the model trained with the camera degradations (the
loader's photo_augment, on by default) against the same training on the lossless tiles
(``flower.augment=null``), counting unseen fields saved as PNG and as JPEG.

    python -m bench flower_jpeg      # ~16 min on 2 idle cores (3 repeats: training seeds 0, 1, 2)

What is compared: the worst JPEG count's distance from the same field's PNG count, in percent, over
two unseen fields each written at JPEG quality 75, 85 and 95 (PIL, 4:2:0, as cameras write them);
lower is better. Issue 52's photo: a lossless-trained model counted a JPEG (quality 90) of a field
29% below its PNG; its bound is 5%. Why it is fair: both sides are the workload's own model,
``train_step``, loader, Adam and cosine schedule, the same fields, steps and seed; only the loader's
degradations differ. Quality: each side's PNG count against the fields' true flowers (a model that
does not count would have no JPEG gap either). A repeat is a training seed: the gap depends on it.
The training is short (seconds of the workload's default run), so it runs in this process, without
Ray: what is measured is the model, not orchard's runtime. This was a CI test until its 2,400 steps
(2.5 min of a 2-core CI machine) were the suite's most expensive single proof; the loader's
degradations themselves are tested in tests/workloads/flower/test_photo_augment.py.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = {
    # 2,400 steps of 8 tiles: at 1,600 the gap still depended on the seed (3 of seeds 0-5 above 5%)
    "full": {"steps": 2400, "fields": 2},
    "smoke": {"steps": 20, "fields": 1},
}
ESTIMATE = "~16 min on 2 idle cores (3 repeats)"
QUALITIES = (75, 85, 95)
BOUND_PCT = 5.0  # issue 52's bound: a field's JPEG counted within 5% of its PNG


def shipped_degradations():
    """The degradations conf/workload/flower.yaml ships (``flower.augment``)."""
    from orchard.config import compose
    from workloads.flower.photo_augment import PhotoDegradation

    return PhotoDegradation.from_config(compose(["workload=flower"])["flower"]["augment"])


def briefly_trained(augment, steps: int = 2400, tile: int = 32, seed: int = 0):
    """The workload's model trained as its Ray Train workers train it (the TileLoader with
    ``augment``, ``train_step``, Adam, batches of 8), in this process and briefly: ``steps`` steps
    of 32 px tiles on four fields with about three times the default flowers per area, so that a
    run of seconds sees enough flowers to count (the default run sees about 6 times the pixels).
    Adam's rate starts at 3x the default and follows a cosine to zero: a constant rate leaves a
    short run where its last steps threw it (JPEGs 6-9% below the PNG at 300 steps, 5-6% at 600),
    a decayed one settles it."""
    import torch

    from workloads.flower.loader import density_targets, TileLoader
    from workloads.flower.model import FlowerCounterCNN
    from workloads.flower.precision import Precision
    from workloads.flower.synthetic_field import field_window, render_field
    from workloads.flower.tiles import split_into_tiles
    from workloads.flower.train import train_step

    rng, roi = np.random.default_rng(seed), field_window(256, 384, tile)
    images, points = [], []
    for _ in range(4):
        rgb, flowers, _ = render_field(rng, 256, 384, roi, tile, 2.0, (2.5, 5.0), 0.25, 0.0)
        tiles, meta = split_into_tiles(rgb, flowers, roi, tile)
        images.append(tiles)
        points += [tile_points for _, _, tile_points in meta]
    images = np.concatenate(images)
    targets = density_targets(points, tile, 2.5).astype(np.float16)
    loader = TileLoader(images, targets, np.arange(len(images)), 8, 100.0, augment=augment)
    torch.manual_seed(seed)
    model = FlowerCounterCNN()
    adam = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(adam, steps)
    sums, step, epoch = torch.zeros(2), 0, 0
    while step < steps:
        order = np.random.default_rng((seed, epoch)).permutation(len(images))
        for x, target in loader.epoch(order, (seed, epoch, 0)):
            train_step(model, adam, Precision("fp32", "cpu"), x, target, sums)
            schedule.step()
            step += 1
            if step == steps:
                break
        epoch += 1
    return model.eval()


def png_and_jpeg_counts(model, folder: Path, seed: int = 0, fields: int = 2) -> list[tuple[int, dict]]:
    """Fields the model never saw, at the default flower density, each written as a camera writes
    it (PIL: PNG, and 4:2:0 JPEG at QUALITIES) and read back as mode=predict reads it; returns
    [(true flowers, {file name: predicted count})] per field."""
    from PIL import Image

    from workloads.flower.predict import count_image, read_image
    from workloads.flower.synthetic_field import field_window, render_field

    rng, out = np.random.default_rng(52 + 1000 * seed), []
    for field in range(fields):
        rgb, flowers, _ = render_field(rng, 384, 576, field_window(384, 576, 64), 64, 2.5, (2.5, 5.0), 0.25, 0.0)
        counts = {}
        for quality in (None, *QUALITIES):
            path = folder / (f"field{field}.png" if quality is None else f"field{field}_q{quality}.jpg")
            Image.fromarray(rgb).save(path, **({} if quality is None else {"quality": quality}))
            counts[path.name] = float(count_image(model, read_image(path), 32, 100.0).sum())
        out.append((len(flowers), counts))
    return out


def jpeg_gap(augment, steps: int, seed: int, fields: int) -> dict:
    """One side of one repeat: train, count; the worst JPEG gap (%), the PNG counts' error
    against the true flowers (%), and the training seconds."""
    t0 = time.perf_counter()
    model = briefly_trained(augment, steps=steps, seed=seed)
    train_s = time.perf_counter() - t0
    worst, png_off = 0.0, 0.0
    with tempfile.TemporaryDirectory(prefix="flower-jpeg-") as tmp:
        for flowers, counts in png_and_jpeg_counts(model, Path(tmp), seed=0, fields=fields):
            png = counts.pop(next(name for name in counts if name.endswith(".png")))
            png_off = max(png_off, 100 * abs(png / flowers - 1))
            worst = max([worst, *(100 * abs(count / png - 1) for count in counts.values())])
    return {"gap_pct": worst, "png_vs_true_pct": png_off, "train_s": train_s}


def measure(size: dict, repeats: int) -> list[dict]:
    from bench.rows import row

    shipped = shipped_degradations()
    sides: dict[str, list[dict]] = {"orchard": [], "peer": []}
    for seed in range(repeats):
        for side, augment in (("orchard", shipped), ("peer", None)):
            got = jpeg_gap(augment, size["steps"], seed, size["fields"])
            sides[side].append(got)
            print(f"  flower_jpeg: seed {seed} {side}: worst JPEG {got['gap_pct']:.1f}% off its PNG, "
                  f"PNG {got['png_vs_true_pct']:.1f}% off the truth, {got['train_s']:.0f} s", flush=True)

    def quality(runs: list[dict]) -> dict:
        return {"worst PNG count vs true flowers %": max(r["png_vs_true_pct"] for r in runs),
                "training s": [round(r["train_s"], 1) for r in runs]}

    labels = {"orchard_label": "flower.augment (the shipped camera degradations)",
              "peer_label": "flower.augment=null (lossless tiles)"}
    gaps = [r["gap_pct"] for r in sides["orchard"]]
    return [row("worst JPEG count vs the same field's PNG", "%", gaps, [r["gap_pct"] for r in sides["peer"]],
                higher_is_better=False, **labels,
                quality={"orchard": quality(sides["orchard"]), "peer": quality(sides["peer"])},
                target={"text": f"every seed's JPEGs within {BOUND_PCT:g}% of the PNG (issue 52)",
                        "met": max(gaps) < BOUND_PCT},
                note=f"{size['steps']} steps of 8 tiles, {size['fields']} unseen field(s) x JPEG {QUALITIES}; "
                     "a repeat is a training seed")]
