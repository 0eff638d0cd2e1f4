"""Errors that the CLI turns into one clear line and an exit code."""


class ConfigError(ValueError):
    """A config value is not allowed.  ``key`` is the dotted config key, ``allowed`` says what is."""

    def __init__(self, key: str, allowed: str):
        self.key = key
        self.allowed = allowed
        super().__init__(f"{key}: {allowed}")


class Diverged(RuntimeError):
    """Training went non-finite (NaN or inf): the run ends FAILED (exit 1) with this one line,
    and goes on only with a new value for ``key``, the config key to change (now ``value``).

    Raised by ``orchard.run.divergence`` from a training loop at its first non-finite loss (``what``
    is the metric's name) or, before a checkpoint, non-finite weights (``what="weights"``).
    ``epoch`` and ``step`` are 1-based counts of the run's training; ``hint`` is other advice for
    the line (``key`` may be None when no single config key sets it); ``checkpoint`` says whether
    the run kept a checkpoint (of finite weights) that ``python -m orchard resume`` goes on from."""

    def __init__(self, what: str, found: str, epoch: int, step: int, key: str | None = None, value=None,
                 hint: str = "", checkpoint: bool = False):
        self.what, self.found, self.epoch, self.step = what, found, int(epoch), int(step)
        self.key, self.value, self.hint, self.checkpoint = key, value, hint, bool(checkpoint)
        verb = "are" if what == "weights" else "is"
        now = f"{value:g}" if isinstance(value, (int, float)) else value
        advice = [f"lower {key}" + (f" (now {now})" if now is not None else "")] if key else []
        advice += [hint] if hint else []
        super().__init__(f"{what} {verb} {found} at epoch {self.epoch} step {self.step}"
                         + (f": {' or '.join(advice)}" if advice else ""))

    def fields(self) -> dict:
        """The constructor's arguments, JSON-ready: ``Diverged(**err.fields())`` is ``err`` again
        (a worker hands them to the driver in a file or a queue)."""
        return {"what": self.what, "found": self.found, "epoch": self.epoch, "step": self.step, "key": self.key,
                "value": self.value, "hint": self.hint, "checkpoint": self.checkpoint}

    def __reduce__(self):  # pickled whole (Ray moves exceptions between processes)
        return _diverged_from_fields, (self.fields(),)


def _diverged_from_fields(fields: dict) -> Diverged:
    return Diverged(**fields)
