"""Errors that the CLI turns into one clear line and an exit code."""


class ConfigError(ValueError):
    """A config value is not allowed.  ``key`` is the dotted config key, ``allowed`` says what is."""

    def __init__(self, key: str, allowed: str):
        self.key = key
        self.allowed = allowed
        super().__init__(f"{key}: {allowed}")
