"""Secrets stay out of what everyone reads: one rule for every writer (params, tags, the
``config.yaml`` artifact, ``.hydra/``, the console's lines).

The run itself gets the real values; what is recorded gets ``***`` for
- a value under a key that names a secret (``*secret*``, ``*password*``, ``*passwd*``,
  ``*token*``, ``*credential*``, and ``*key*`` under ``env_vars``, e.g. ``AWS_SECRET_ACCESS_KEY``),
- the password of a URI's user-info (``postgresql://user:***@host/db``, ``s3://KEY:***@bucket``),
in a config (a dict), a ``key=value`` override, or any text.
"""
from __future__ import annotations

import re

MASK = "***"
_SECRET_NAME = re.compile(r"secret|passw(or)?d|token|credential|private_?key|api_?key", re.IGNORECASE)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s'\"]*):(?P<password>[^/@\s'\"]+)@")
# inside an override's value: {AWS_SECRET_ACCESS_KEY: abc, ...} or key=value pairs
_INNER_PAIR = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_.]*)(?P<sep>\s*[:=]\s*)(?P<value>[^,}\s]+)")


def secret_key(path: str) -> bool:
    """Whether a config key (dotted path) holds a secret."""
    name = path.rsplit(".", 1)[-1]
    return bool(_SECRET_NAME.search(name)) or (".env_vars." in f".{path}" and "key" in name.lower())


def text(value: str) -> str:
    """``value`` with the passwords of its URIs masked."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", str(value))


def config(cfg, path: str = ""):
    """A copy of a config (dicts, lists, scalars) with secret values masked."""
    if isinstance(cfg, dict):
        return {k: (MASK if secret_key(f"{path}.{k}".lstrip(".")) and v not in (None, "", {})
                    and not isinstance(v, dict) else config(v, f"{path}.{k}".lstrip(".")))
                for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [config(v, path) for v in cfg]
    return text(cfg) if isinstance(cfg, str) else cfg


def override(item: str) -> str:
    """One command-line override (``key=value``) as it may be recorded."""
    key, sep, value = str(item).partition("=")
    if not sep:
        return text(item)
    if secret_key(key.lstrip("+~")):
        return f"{key}={MASK}"

    def inner(m: re.Match) -> str:
        qualified = f"{key.lstrip('+~')}.{m['name']}"
        return f"{m['name']}{m['sep']}{MASK}" if secret_key(qualified) else m.group(0)

    return f"{key}={_INNER_PAIR.sub(inner, text(value))}"


def overrides(items) -> list[str]:
    return [override(o) for o in items]
