"""kernels.check's rows kept on disk, so a kernel that did not change is not compiled again.

A compile for four cards is ~500 ptxas runs (minutes on two cores); almost every run of the check
(the tests, `--perf`) follows a change to one kernel or none. A row is keyed by everything that
can change it: the source of every module in flashdesk/kernels (a kernel may call helpers of
another), the saved launch log a spec list may come from, the spec's module, index and name, the
arch, whether the performance fields were asked for, and the Triton version (its compiler and
ptxas), and the spec module's own source. FLASHDESK_CHECK_CACHE names the folder ("off": no
cache); the default is the user's cache folder. A row whose worker died is never kept.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from importlib import metadata
from pathlib import Path

VARIABLE = "FLASHDESK_CHECK_CACHE"
KERNELS = Path(__file__).resolve().parent


def folder() -> Path | None:
    value = os.environ.get(VARIABLE, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashdesk" / "kernel-check"


@functools.lru_cache(maxsize=1)
def _sources() -> str:
    digest = hashlib.sha256()
    for path in sorted(KERNELS.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _triton_version() -> str:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return "none"


def _file_digest(path: str | None) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""
    except OSError:
        return ""


def key(module: str, index: int, name: str, cap: int, perf: bool) -> str | None:
    """The row's key, or None (not cached) for a spec module whose source cannot be found."""
    try:
        found = importlib.util.find_spec(module.partition(":")[0])
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin:
        return None
    text = json.dumps(
        [
            _sources(),
            _file_digest(found.origin),
            _file_digest(os.environ.get("FLASHDESK_LAUNCH_LOG")),
            module,
            index,
            name,
            cap,
            perf,
            _triton_version(),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def get(row_key: str | None) -> dict | None:
    where = folder()
    if where is None or row_key is None:
        return None
    try:
        row = json.loads((where / f"{row_key}.json").read_text())
    except (OSError, ValueError):
        return None
    return dict(row, cached=True)


def put(row_key: str | None, row: dict) -> None:
    where = folder()
    if where is None or row_key is None or (row.get("error") or "").startswith("compile worker died"):
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        temporary = where / f"{row_key}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(row))
        temporary.replace(where / f"{row_key}.json")
    except OSError:
        pass  # a read-only home: the check runs, it just compiles again next time
