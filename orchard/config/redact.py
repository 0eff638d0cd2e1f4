"""Secrets stay out of what everyone reads: one rule for every writer (params, tags, the
``config.yaml`` artifact, ``.hydra/``, ``orchard.log``, error tags and ``error.txt``, every console
line through ``say``), and what orchard writes is its owner's alone (``private_folder``).

The run itself gets the real values; what is recorded gets ``***`` for
- every value under ``runtime_env`` (env vars, pip, anything): no rule on names tells
  ``GITHUB_PAT`` or ``SENTRY_DSN`` from ``OMP_NUM_THREADS``, so none is kept (names are),
- a value under a key that names a secret (``*secret*``, ``*password*``, ``*token*``,
  ``*credential*``, ``*private_key*``, ``*api_key*``), anywhere,
- the user-info of every URI: its password (``postgresql://user:***@host/db``), or all of it
  when it has none (``https://***@github.com/...``: a token in the user's place),
- the query values of every URI (``s3://b/p?secret_key=***``) but those in ``PUBLIC_QUERY``,
in a config (a dict), a ``key=value`` override (a dict literal that names one of these keys
is masked whole: its quoting is Hydra's, not ours to parse), or any text.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

MASK = "***"
# Sections whose every value is masked, whatever its name.
MASKED_SECTIONS = ("runtime_env", "env_vars")
_SECRET_NAME = re.compile(r"secret|passw(or)?d|token|credential|private_?key|api_?key", re.IGNORECASE)
# Query parameters that never carry a secret: kept, so the links orchard prints still work.
PUBLIC_QUERY = frozenset({"workflowType", "region", "scheme", "endpoint_override"})
_STOP = r"\s'\"{}\[\]"  # what ends a URI inside a line, an override or a dict literal
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# user-info: everything from the scheme to the authority's last "@" (a password may hold an "@")
_USERINFO = re.compile(rf"(?P<scheme>{_SCHEME})(?P<userinfo>[^{_STOP}/?#]*)@")
_QUERY = re.compile(rf"(?P<head>{_SCHEME}[^{_STOP}?#]*)\?(?P<query>[^{_STOP}#]*)")
# the keys of a dict literal in an override's value: {name: ..., 'name': ...}
_LITERAL_KEY = re.compile(r"[{,]\s*['\"]?([A-Za-z_][\w.-]*)['\"]?\s*:")


def secret_key(path: str) -> bool:
    """Whether a config key (dotted path) holds a secret: it names one, or it lies in a
    ``MASKED_SECTIONS`` section."""
    parts = path.split(".")
    return bool(_SECRET_NAME.search(parts[-1])) or any(p in MASKED_SECTIONS for p in parts)


def _query(m: re.Match) -> str:
    pairs = [(name, sep, value) for name, sep, value in (p.partition("=") for p in m["query"].split("&"))]
    return m["head"] + "?" + "&".join(f"{n}{s}{v if not s or n in PUBLIC_QUERY else MASK}" for n, s, v in pairs)


def _userinfo(m: re.Match) -> str:
    user, colon, _ = m["userinfo"].partition(":")
    return f"{m['scheme']}{user + ':' if colon else ''}{MASK}@"


def text(value) -> str:
    """``value`` (any text: an error, a URI, a line) with its URIs' user-info and query values masked."""
    return _QUERY.sub(_query, _USERINFO.sub(_userinfo, str(value)))


def _all_masked(value):
    """Every leaf of ``value`` masked; dict keys (names) kept, empty values left empty."""
    if isinstance(value, dict):
        return {k: _all_masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_all_masked(v) for v in value]
    return value if value in (None, "") else MASK


def config(cfg, path: str = ""):
    """A copy of a config (dicts, lists, scalars) with secret values masked."""
    if isinstance(cfg, dict):
        out = {}
        for k, v in cfg.items():
            key = f"{path}.{k}".lstrip(".")
            out[k] = _all_masked(v) if secret_key(key) else config(v, key)
        return out
    if isinstance(cfg, (list, tuple)):
        return [config(v, path) for v in cfg]
    return text(cfg) if isinstance(cfg, str) else cfg


def override(item: str) -> str:
    """One command-line override (``key=value``) as it may be recorded."""
    key, sep, value = str(item).partition("=")
    if not sep:
        return text(item)
    literal = value.lstrip()[:1] in ("{", "[")
    if secret_key(key.lstrip("+~")) or (literal and any(secret_key(k) for k in _LITERAL_KEY.findall(value))):
        return f"{key}={MASK}"
    return f"{key}={text(value)}"


def overrides(items) -> list[str]:
    return [override(o) for o in items]


# --------------------------------------------------------------------------- files
PRIVATE_FOLDER, PRIVATE_FILE = 0o700, 0o600


def private_folder(path: str | os.PathLike) -> Path:
    """``path`` made (with its missing parents) and readable by its owner only: what a run
    records (its folder, the logs, a local store's artifacts) holds its config and output, and
    a shared machine's other users have no business there. A folder that existed before, the
    user's own, keeps its mode."""
    path = Path(path)
    if not path.is_dir():
        path.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
        os.chmod(path, PRIVATE_FOLDER)  # mkdir's mode passes through the umask
    return path
