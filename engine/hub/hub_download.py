"""Resumable downloads of a Hub repository's weights into the standard Hugging Face cache.

huggingface_hub 2.x resumes a dropped connection within one run but deletes its partial file when
the run itself ends, so a 5 GB shard would start from zero after a Ctrl-C. Here the bytes go to
`blobs/{etag}.incomplete`, kept between runs and continued with an HTTP Range request, and the
finished file is placed exactly where huggingface_hub would put it (`blobs/{etag}`, with
`snapshots/{commit}/{name}` a relative link to it). `engine/hub/models.py` uses this for `*.safetensors`.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from pathlib import Path
from typing import Callable

from flashdesk.engine.errors import FlashDeskError
from flashdesk.paths import hub_cache_dir  # the models folder, shared with the app's Settings

# Downloaded here so that an interrupted download continues on the next run; everything else goes
# through huggingface_hub's snapshot_download (engine/hub/models.py).
RESUMABLE_FILES = ["*.safetensors"]
SKIPPED_FILES = ["*/*"]  # only the top level of a repository is the checkpoint
SHA256 = re.compile(r"[0-9a-f]{64}")


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _download_error(repo_id: str, exc: Exception) -> FlashDeskError:
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, GatedRepoError):
        return FlashDeskError(f"{repo_id} is gated: accept its terms on the Hub, then set HF_TOKEN ({first})")
    if isinstance(exc, RepositoryNotFoundError):
        return FlashDeskError(f"{repo_id}: no such model on {hub_endpoint()} (or it is private: set HF_TOKEN)")
    if isinstance(exc, LocalEntryNotFoundError):
        return FlashDeskError(
            f"cannot reach {hub_endpoint()} to download {repo_id}: check the connection "
            f"(HF_ENDPOINT, proxy settings) ({first})"
        )
    return FlashDeskError(
        f"download of {repo_id} stopped: {type(exc).__name__}: {first}. Run the same command "
        "again to continue: files already downloaded are kept, and a weights file cut off "
        "half-way continues where it stopped"
    )


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# --- resumable download of the weights ---------------------------------------------------------

RETRY_WAIT_S = 1.0  # pause before continuing after a dropped connection (huggingface_hub's too)
MAX_TRIES = 5  # attempts in a row that bring no new byte before this run gives up on a file


def _is_resumable(filename: str) -> bool:
    from huggingface_hub.utils import filter_repo_objects

    return bool(list(filter_repo_objects([filename], allow_patterns=RESUMABLE_FILES, ignore_patterns=SKIPPED_FILES)))


Progress = Callable[[str, int, int], None]  # (file, bytes done, bytes total) of one file


def _fetch_resumable(
    repo_id: str,
    snapshot: Path,
    only: list[str] | None = None,
    replace: bool = False,
    fresh: bool = False,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
    progress: Progress | None = None,
) -> set[str]:
    """Download the weights of the snapshot's commit that are not in it yet (or `only` those), continuing
    any partial file an earlier run left. Returns the sha256s verified on the way.

    `replace`: download even the files already there (`--force`, or a repair of a damaged file);
    `fresh`: and from zero, not continuing a partial file (`--force`).
    `progress(file, done, total)`: called as the bytes of each file arrive.

    The file list is the tree listing snapshot_download cached on disk for this commit; without one
    (the Hub unreachable and an older snapshot on disk) nothing is downloaded and the check after
    the download names what is missing.
    """
    import httpx2
    from huggingface_hub import get_cached_repo_tree, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import CachedRepoTreeNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    commit = snapshot.name
    if only is None:
        try:
            tree = get_cached_repo_tree(repo_id, revision=commit, cache_dir=hub_cache_dir())
        except (CachedRepoTreeNotFoundError, OSError, ValueError):
            return set()
        only = list(
            filter_repo_objects([f.path for f in tree], allow_patterns=RESUMABLE_FILES, ignore_patterns=SKIPPED_FILES)
        )
    todo = [name for name in only if replace or not (snapshot / name).is_file()]
    if not todo:
        return set()
    storage = snapshot.parent.parent  # models--{org}--{name}
    try:
        metadata = {}  # name: (url, its ETag, its size)
        for name in todo:
            url = hf_hub_url(repo_id, name, revision=commit, endpoint=hub_endpoint())
            meta = get_hf_file_metadata(url, endpoint=hub_endpoint())
            if not meta.etag:
                raise FlashDeskError(
                    f"{hub_endpoint()} sent no ETag for {repo_id}/{name}: is HF_ENDPOINT a Hugging Face Hub?"
                )
            metadata[name] = (url, meta.etag, meta.size)
        if progress is not None:  # every file's size is known before the first byte: a stable total
            for name, (_, etag, size) in metadata.items():
                partial = storage / "blobs" / f"{etag}.incomplete"
                have = partial.stat().st_size if partial.is_file() and not fresh else 0
                progress(name, min(have, size or have), size or 0)
        _remove_stale_partials(storage, keep={etag for _, etag, _ in metadata.values()}, log=log)
        verified = set()
        for name, (url, etag, size) in metadata.items():
            if _download_resumable(
                storage, commit, name, url, etag, size, replace, fresh, show_progress, log, progress
            ):
                verified.add(etag)
        return verified
    except (OSError, ValueError, httpx2.HTTPError) as exc:
        raise _download_error(repo_id, exc) from exc


def _lock_path(storage: Path, etag: str) -> Path:
    """The lock huggingface_hub takes for this blob (`{cache}/.locks/{repo folder}/{etag}.lock`)."""
    return storage.parent / ".locks" / storage.name / f"{etag}.lock"


def _remove_stale_partials(storage: Path, keep: set[str], log: Callable[[str], None]) -> None:
    """Delete `blobs/{etag}.incomplete` files of this repository whose etag is no longer wanted (the
    file changed on the Hub since): they can never be continued. One in use elsewhere is left alone."""
    from filelock import Timeout
    from huggingface_hub.utils import WeakFileLock

    blobs = storage / "blobs"
    if not blobs.is_dir():
        return
    for partial in sorted(blobs.glob("*.incomplete")):
        etag = partial.name.removesuffix(".incomplete")
        if etag in keep or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", etag):
            continue  # ours to continue, or not ours (huggingface_hub's own are {etag}.{uuid}.incomplete)
        try:
            with WeakFileLock(_lock_path(storage, etag), timeout=0.5):
                size = partial.stat().st_size
                partial.unlink()
            log(
                f"Removed an outdated partial download ({_size(size)}, {partial.name}): the file changed on "
                "the Hub since"
            )
        except (Timeout, OSError):
            pass


def _download_resumable(
    storage: Path,
    commit: str,
    filename: str,
    url: str,
    etag: str,
    size: int | None,
    replace: bool,
    fresh: bool,
    show_progress: bool,
    log: Callable[[str], None],
    progress: Progress | None = None,
) -> bool:
    """Download one file into `blobs/{etag}` through `blobs/{etag}.incomplete`, continuing what is
    there, and link it from the snapshot. True when its sha256 was checked and matches the etag."""
    from huggingface_hub.utils import WeakFileLock

    blob = storage / "blobs" / etag
    partial = blob.with_name(f"{etag}.incomplete")
    pointer = storage / "snapshots" / commit / filename
    blob.parent.mkdir(parents=True, exist_ok=True)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(storage, etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    verified = False
    with WeakFileLock(lock):  # the same lock as huggingface_hub: one writer per blob, in any process
        if replace or not blob.is_file():
            if fresh:
                partial.unlink(missing_ok=True)
            verified = _download_to_partial(url, partial, etag, size, filename, show_progress, log, progress)
            os.replace(partial, blob)
        _link(blob, pointer)
    return verified


def _download_to_partial(
    url: str,
    partial: Path,
    etag: str,
    size: int | None,
    filename: str,
    show_progress: bool,
    log: Callable[[str], None],
    progress: Progress | None = None,
) -> bool:
    """Bring `partial` to the whole file: an HTTP Range request from its current size, repeated after
    a dropped connection (at most MAX_TRIES times in a row without progress); from zero if it is
    longer than the file, or from the whole body the server sends when it ignores the Range (HTTP
    200). True when the sha256 was checked.

    A sha256 that differs after continuing a partial file means the bytes kept on disk were bad:
    the file is downloaded again from zero, once. A sha256 that differs after a download from zero
    is left for the check after the download to name (as with files huggingface_hub downloads).
    """
    import httpx2
    from huggingface_hub import constants, get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, tqdm

    check_sha = SHA256.fullmatch(etag) is not None
    have = partial.stat().st_size if partial.is_file() else 0
    if size is not None and have > size:
        log(f"{filename}: the partial download is larger than the file ({have} > {size} bytes); starting over")
        partial.unlink()
        have = 0
    resumed = have > 0
    if resumed:
        log(f"{filename}: continuing a partial download at {have} of {size} bytes")
    sha = hashlib.sha256()
    if check_sha and have:
        with partial.open("rb") as held:
            while chunk := held.read(1 << 24):
                sha.update(chunk)
    report = progress or (lambda file, done, total: None)
    report(filename, have, size or 0)
    desc = filename if len(filename) <= 40 else f"(…){filename[-40:]}"
    with tqdm(
        total=size,
        initial=have,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        disable=not show_progress or None,
    ) as bar:

        def restart(why: str) -> None:
            nonlocal have, sha
            log(f"{filename}: {why}; downloading it from the start")
            partial.unlink(missing_ok=True)
            have, sha = 0, hashlib.sha256()
            bar.reset(total=size)
            report(filename, 0, size or 0)

        tries = 0
        while True:
            while size is None or have < size:
                tries += 1
                report(filename, have, size or 0)  # also lets the caller stop between attempts
                if tries > MAX_TRIES:
                    raise OSError(
                        f"{filename}: no progress after {MAX_TRIES} attempts ({have} of {size} bytes "
                        "kept for the next run)"
                    )
                headers = build_hf_headers()
                headers["Accept-Encoding"] = "identity"  # byte offsets must be those of the file itself
                if have:
                    headers["Range"] = f"bytes={have}-"
                try:
                    with get_session().stream(
                        "GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
                    ) as response:
                        if have and response.status_code == 416:
                            restart("the server refused to continue the partial download")
                            continue
                        hf_raise_for_status(response)
                        if have and response.status_code == 200:  # Range ignored: this is the whole file
                            restart(f"the server ignored the request to continue at byte {have} (HTTP 200, not 206)")
                        elif have and not _continues_at(response, have):
                            restart(
                                f"the server did not continue at byte {have} (HTTP {response.status_code}, "
                                f"Content-Range {response.headers.get('Content-Range')!r})"
                            )
                            continue
                        if size is None:
                            length = response.headers.get("Content-Length")
                            size = have + int(length) if length and length.isdigit() else None
                            bar.total = size
                            report(filename, have, size or 0)
                        too_long = False
                        with partial.open("ab") as f:
                            for chunk in response.iter_bytes():
                                if size is not None and have + len(chunk) > size:
                                    too_long = True
                                    break
                                f.write(chunk)
                                f.flush()  # on disk as it arrives: kept even if the process is killed
                                if check_sha:
                                    sha.update(chunk)
                                have += len(chunk)
                                bar.update(len(chunk))
                                tries = 0
                                report(filename, have, size or 0)
                        if too_long:
                            partial.unlink()
                            raise OSError(
                                f"{filename}: the server sent more than the {size} bytes the Hub "
                                "listed; the partial download was removed"
                            )
                    if size is None:
                        size = have  # no length known: the server's end of the body is the end of the file
                        report(filename, have, size)
                except httpx2.TransportError as exc:  # refused, reset, cut or timed out
                    if tries >= MAX_TRIES:
                        raise
                    log(f"{filename}: connection lost at {have} of {size} bytes ({type(exc).__name__}); continuing")
                    time.sleep(RETRY_WAIT_S)
            if not check_sha or sha.hexdigest() == etag:
                return check_sha
            if not resumed:
                return False  # bad bytes from the server: the check after the download names the file
            resumed, tries = False, 0
            restart("its sha256 differs from the Hub's after continuing the partial download")


def _continues_at(response, offset: int) -> bool:
    """Whether a response to `Range: bytes={offset}-` is the file from `offset` on (206, Content-Range)."""
    if response.status_code != 206:
        return False
    match = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*", response.headers.get("Content-Range", ""))
    return match is not None and int(match.group(1)) == offset


def _link(blob: Path, pointer: Path) -> None:
    """`pointer` (in snapshots/) a relative symlink to `blob`, as huggingface_hub makes it; where the
    file system has no symlinks, the blob itself is moved there (huggingface_hub does the same)."""
    target = os.path.relpath(blob, pointer.parent)
    if pointer.is_symlink() and os.readlink(pointer) == target:
        return
    tmp = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.symlink(target, tmp)
    except OSError:
        os.replace(blob, pointer)
        return
    os.replace(tmp, pointer)
