"""flower.precision, flower.channels_last and flower.compile: how the step runs, not what it computes.

- ``fp32`` (default): plain float32.
- ``bf16``: autocast to bfloat16 (CUDA and CPU); float32's exponent range, so no loss scaling.
- ``fp16``: autocast to float16 with a GradScaler (its narrow range underflows small
  gradients without one). torch 2.13 autocasts float16 on the CPU too and has a CPU GradScaler,
  so the option runs everywhere; on a CPU it is a correctness check, not a speed-up. The scaler
  steps a torch optimizer, so fp16 is for strategy=ring (ps servers apply the raw gradients in
  numpy: use bf16 there; ``validate`` says so).
The loss is always computed in float32 from the model's output.
"""
from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """``with p.autocast(): out = model(x)``; ``p.backward(loss)``; ``p.step(replica)``."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.dtype = name, DTYPES[name]
        self.device_type = torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type) if name == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, replica) -> None:
        """The optimizer step; with fp16 through the scaler (it skips steps whose gradients
        overflowed and adapts the scale), which needs the replica's torch optimizer."""
        if self.scaler is None:
            replica.step()
            return
        self.scaler.step(replica.optimizer)
        self.scaler.update()

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def prepare_model(model: torch.nn.Module, channels_last: bool) -> torch.nn.Module:
    """The model in the memory layout the step will feed it (before the replica wraps it)."""
    return model.to(memory_format=torch.channels_last) if channels_last else model


def compiled(forward, enabled: bool):
    """``torch.compile(forward)`` when enabled (the first steps pay the compile), else as is."""
    return torch.compile(forward) if enabled else forward
