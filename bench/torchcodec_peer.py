"""torchcodec, the video bench's peer, decoding over the FFmpeg that PyAV ships.

torchcodec loads FFmpeg's shared libraries by their plain names (``libavcodec.so.62`` ...) and
finds none on a machine without a system FFmpeg. PyAV's wheel (orchard's decoder, a dependency)
carries FFmpeg 8's libraries under renamed files (``av.libs/libavcodec-<hash>.so.62.*``). This
module links the plain names to those files in a folder of its own and runs torchcodec in a child
process whose ``LD_LIBRARY_PATH`` starts there (the dynamic loader reads it only when a process
starts). Both decoders then run the very same FFmpeg build, so the row compares the libraries'
callers, not two FFmpeg versions.

torchcodec's wheel must be the one built for the installed torch (0.13 for torch 2.13: the bench
extra pins it); its later wheels link ``libtorch_cuda.so`` and load only beside a CUDA torch.

    python -m bench.torchcodec_peer < job.json   # the child: prints "<seconds> <checksum>"
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the FFmpeg libraries torchcodec links, as "<name>-<hash>.so.<major>.<minor>.<micro>" in av.libs
FFMPEG_LIB = re.compile(r"^(lib(?:avutil|avcodec|avformat|avdevice|avfilter|swscale|swresample))-[0-9a-f]+\.so\.(\d+)\.")


def pyav_libs() -> Path | None:
    """The folder of FFmpeg libraries inside PyAV's wheel, or None (PyAV built from source)."""
    spec = importlib.util.find_spec("av")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).parent / "av.libs"
    return folder if folder.is_dir() else None


def ffmpeg_folder(libs: Path) -> Path:
    """A folder of ``lib<name>.so.<major>`` links to PyAV's FFmpeg (made once per PyAV install)."""
    folder = Path(tempfile.gettempdir()) / f"orchard-ffmpeg-{hashlib.sha1(str(libs).encode()).hexdigest()[:10]}"
    folder.mkdir(exist_ok=True)
    for lib in libs.iterdir():
        m = FFMPEG_LIB.match(lib.name)
        if m:
            link = folder / f"{m.group(1)}.so.{m.group(2)}"
            if not link.exists():
                link.symlink_to(lib)
    return folder


def child_env() -> dict[str, str]:
    """The child's environment: PyAV's FFmpeg first on the loader's path (and av.libs beside it,
    where those libraries find their own dependencies)."""
    env = dict(os.environ)
    libs = pyav_libs()
    if libs is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(ffmpeg_folder(libs)), str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def _child(job: dict) -> tuple[float, int]:
    import torch
    from torchcodec.decoders import VideoDecoder

    if job.get("probe"):
        return 0.0, 0
    t0, checksum = time.perf_counter(), 0
    for path, offset, count in job["clips"]:
        dec = VideoDecoder(path, seek_mode="exact", num_ffmpeg_threads=job["threads"])
        frames = dec.get_frames_at(list(range(offset, offset + count))).data  # (N, C, H, W) uint8
        checksum += int(frames.sum(dtype=torch.int64))
    return time.perf_counter() - t0, checksum


def _call(job: dict) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-m", "bench.torchcodec_peer"], input=json.dumps(job), env=child_env(),
                         capture_output=True, text=True, check=False, cwd=Path(__file__).parents[1])
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"torchcodec child exit {out.returncode}: {last[:160]}")
    seconds, checksum = out.stdout.split()[-2:]
    return float(seconds), int(checksum)


def absent() -> tuple[str, str] | None:
    """(status, note) saying why torchcodec cannot be measured here, or None when it decodes."""
    if importlib.util.find_spec("torchcodec") is None:
        return "not installed (torchcodec)", 'pip install -e ".[bench]"'
    try:
        _call({"probe": True})
    except RuntimeError as exc:  # a torch it was not built for, or no FFmpeg it knows
        return "needs a torchcodec built for this torch, and FFmpeg's shared libraries", str(exc)[:120]
    return None


def run(jobs, size: int, cores: int) -> tuple[float, int]:
    """(seconds, checksum) of torchcodec decoding `jobs` as its docs use it: ``VideoDecoder(path,
    seek_mode="exact", num_ffmpeg_threads=N).get_frames_at(indices)``, timed inside the child after
    its imports (as the in-process peers' imports are done before their timers)."""
    del size  # the synthetic files are encoded at the decoded size: no resize (as for decord's row)
    return _call({"clips": [(path, offset, count) for path, _, offset, count in jobs], "threads": cores})


if __name__ == "__main__":
    print(*_child(json.loads(sys.stdin.read())))
