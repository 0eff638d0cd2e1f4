"""CI's torch check: torch imports and computes, whatever its build.

A CPU build (PyTorch's CPU index, or this machine's local wheel) and a CUDA build (PyPI's default
Linux wheel) both pass, with or without a GPU: a CUDA build on a machine without one runs on the
CPU, which is all the test suite needs (GPU tests are skipped there). Prints what it found.
"""
import torch

product = torch.ones(3) @ torch.ones(3)  # a real kernel, not only an import
assert float(product) == 3.0, f"torch {torch.__version__} computed {product} for 1.1 + 1.1 + 1.1"
cuda = getattr(torch.version, "cuda", None)
build = f"CUDA {cuda} build" if cuda else "CPU build"
device = f"GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU visible, runs on the CPU"
print(f"torch {torch.__version__}: {build}, {device}")
