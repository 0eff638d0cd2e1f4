"""A seal on a sweep's saved Tune state: a resume reads back only what this user's driver wrote.

Ray Tune resumes an experiment by unpickling what it saved (``tuner.pkl``, the trials and
callbacks inside ``experiment_state-*.json``, searcher state, a trial's ``error.pkl``), and
unpickling runs code. That state lives in the sweep's storage (``<storage root>/sweeps/<key>/tune``),
often a bucket a whole team can write: whoever plants an object there would run code in the next
driver that resumes the sweep. So when a sweep's ``fit()`` returns (finished, Ctrl-C, SIGTERM),
orchard lists the files *its own driver* wrote there, with a SHA-256 each: Tune's local staging
copy (what it uploads), ``tuner.pkl`` as it was created, and what an earlier sealed session left;
never the bucket's listing, which may hold a planted object. The list is signed with HMAC-SHA256
under a key that stays in this user's home (``$XDG_CONFIG_HOME/orchard/sweep-state.key``, 0600,
never in the store). Before Tune reads anything back, the folder must hold exactly the sealed
files with the sealed digests; otherwise the sweep is refused, and deleting the folder starts it
afresh (docs/sweeps.md).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

SEAL = "orchard-seal.json"
MARKER = ".validate_storage_marker"  # empty; Ray writes it straight to storage on every start


class Unsealed(Exception):
    """The saved state cannot be shown to be this user's own; the message says why."""


def key_path() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "orchard" / "sweep-state.key"


def _key(create: bool) -> bytes:
    path = key_path()
    if not path.exists() and create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:  # O_EXCL: two sweeps starting together keep one key
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        except FileExistsError:
            pass
    if not path.exists():
        raise Unsealed(f"was not sealed here (no key {path})")
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        # a key others can read lets them forge a seal
        raise Unsealed(f"cannot be checked: the key {path} must be yours alone (chmod 600)")
    return bytes.fromhex(path.read_text().strip())


def _mac(key: bytes, where: str, files: dict[str, str]) -> str:
    body = json.dumps({"where": where, "files": files}, sort_keys=True).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def local_digests(folder: str | Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under a local folder (Tune's staging copy; a
    resumed Tune copies the storage folder into it first, the seal with it: left out)."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
             if p.is_file() and not p.is_symlink()}
    return {rel: digest(p.read_bytes()) for rel, p in files.items() if rel != SEAL}


def stored_names(storage) -> list[str]:
    """Every file under a folder in storage (``orchard.storage.Storage``), relative, the seal left out."""
    import pyarrow.fs as pafs

    fs, base = storage._fs_path()
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    names = (i.path[len(base.rstrip("/")) + 1:] for i in infos if i.type != pafs.FileType.Directory)
    return sorted(n for n in names if n != SEAL)


def stored_digests(storage) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under a folder in storage."""
    return {rel: digest(storage.read_bytes(rel)) for rel in stored_names(storage)}


def seal(storage, files: dict[str, str]) -> None:
    """Sign ``files`` (``{relative path: sha256}``, what this driver wrote) into ``storage``."""
    files = {**files, MARKER: digest(b"")}
    storage.write_json(SEAL, {"files": files, "mac": _mac(_key(create=True), storage.uri, files)})


def verify(storage) -> dict[str, str]:
    """The sealed files, once ``storage`` is shown to hold exactly them; raises ``Unsealed``."""
    if not storage.exists(SEAL):
        raise Unsealed("is not sealed (its driver died before sealing it, or someone else wrote it)")
    try:
        record = storage.read_json(SEAL)
        files, mac = dict(record["files"]), str(record["mac"])
    except (ValueError, KeyError, TypeError):
        raise Unsealed(f"has an unreadable {SEAL}") from None
    if not hmac.compare_digest(_mac(_key(create=False), storage.uri, files), mac):
        raise Unsealed("was sealed with another key (another user's, or another machine's)")
    found = stored_digests(storage)
    for rel in sorted(set(found) | set(files)):
        if rel not in files:
            raise Unsealed(f"holds a file orchard did not write: {rel}")
        if rel not in found:
            raise Unsealed(f"misses a sealed file: {rel}")
        if found[rel] != files[rel]:
            raise Unsealed(f"has a file changed since it was sealed: {rel}")
    return files
