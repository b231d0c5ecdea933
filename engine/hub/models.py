"""Models on disk: pull them from the Hub, list what is here, resolve `--model` / `--draft` names.

Why its own module: `pull` is the one place FlashDesk reaches the network. Everything else here
(list, resolve, the file check) reads only the disk, so a model named by its Hub id loads offline
exactly like a folder. Downloads go through huggingface_hub into its standard cache, so the files
are shared with every other Hugging Face tool; HF_HOME / HF_HUB_CACHE, HF_ENDPOINT and HF_TOKEN
are read when a function runs (not when huggingface_hub was imported), and only the files the
engine reads are fetched.

The weights (`*.safetensors`, gigabytes each) are the exception: `engine/hub/hub_download.py` fetches
them itself so that an interrupted download continues on the next run, and places them exactly
where huggingface_hub would.

The check after a download is the loader's own header reader (`weights.read_header`) matched
against the index, plus, for files in the cache, the size the Hub listed and the sha256 the Hub
named the blob by: a truncated or corrupted file is named before the engine ever opens it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

from flashdesk.engine.errors import CheckpointError, FlashDeskError
from flashdesk.engine.hub.hub_download import (
    RESUMABLE_FILES,
    SHA256,
    SKIPPED_FILES,
    Progress,
    _download_error,
    _fetch_resumable,
    _is_resumable,
    _size,
    hub_cache_dir,
    hub_endpoint,
)

DEFAULT_REPOS = ("cyankiwi/gemma-4-26B-A4B-it-AWQ-4bit", "z-lab/gemma-4-26B-A4B-it-DFlash")
# Gemma 4's own MTP assistant for the same target, a second drafter to compare with DFlash: offered
# beside the pair (`models pull` names it, the setup page has a box for it), not pulled by default.
ASSISTANT_REPO = "google/gemma-4-26B-A4B-it-assistant"
ASSISTANT_BYTES = 840 * 10**6  # about: its bf16 weights, 839 MB by its config (the small files not counted)
KNOWN_REPOS = DEFAULT_REPOS + (ASSISTANT_REPO,)
# What the engine reads from a model folder; nothing else is downloaded (no images, READMEs,
# onnx, gguf, other weight formats). Subfolders are skipped: the engine reads the top level only.
ENGINE_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
]
INDEX_FILE, SINGLE_FILE = "model.safetensors.index.json", "model.safetensors"
TARGET_ARCHS = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


# --- where things are ------------------------------------------------------------------------


def registry_path() -> Path:
    """The JSON file listing the model folders the user added (platformdirs' config folder)."""
    import platformdirs

    return Path(platformdirs.user_config_dir("flashdesk")) / "models.json"


def resolve_model_path(name_or_dir: str | Path) -> Path:
    """A model folder for `--model` / `--draft`: a directory as is, a Hub id as its cached snapshot.

    Never touches the network: a Hub id must have been pulled (`flashdesk models pull ID`). A name
    that is neither a directory nor shaped like a Hub id comes back as a Path, for the loader to
    report in its own words.
    """
    path = Path(name_or_dir).expanduser()
    name = str(name_or_dir)
    if path.is_dir() or not REPO_ID.fullmatch(name):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError

    cache = hub_cache_dir()
    try:
        return Path(
            snapshot_download(
                name, cache_dir=cache, local_files_only=True, allow_patterns=ENGINE_FILES, ignore_patterns=SKIPPED_FILES
            )
        )
    except IncompleteSnapshotError:
        raise FlashDeskError(
            f"{name} is only partly downloaded in {cache}: run `flashdesk models pull {name}` to finish the download"
        ) from None
    except (OSError, ValueError):  # LocalEntryNotFoundError, HFValidationError
        raise FlashDeskError(
            f"{name}: no such folder, and no Hub model of that name in the cache {cache}; "
            f"run `flashdesk models pull {name}` to download it, or give the folder "
            "that holds it"
        ) from None


# --- the file check --------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A file of a model folder that is missing or damaged, and how."""

    file: str  # relative to the folder
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


def check_folder(folder: str | Path) -> list[Problem]:
    """Check config.json and every safetensors header against the index, reading headers only.

    Per shard: present, header intact and every tensor's bytes inside the file (`read_header`),
    the tensors the index places in it present and no others.
    """
    from flashdesk.engine.loading.weights import read_header  # imports torch: only when checking

    folder = Path(folder)
    problems = []
    try:
        json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(Problem("config.json", "missing"))
    except (OSError, ValueError) as exc:
        problems.append(Problem("config.json", f"unreadable or not JSON ({exc})"))
    shards: Mapping[str, set[str] | None]  # the tensors the index places in each file (None: no index)
    if (folder / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))["weight_map"]
            placed: dict[str, set[str]] = {}
            for name, shard in weight_map.items():
                placed.setdefault(shard, set()).add(name)
            shards = placed
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return problems + [Problem(INDEX_FILE, f"not a valid safetensors index ({exc})")]
    elif (folder / SINGLE_FILE).is_file():
        shards = {SINGLE_FILE: None}
    else:
        return problems + [Problem(SINGLE_FILE, f"missing (and no {INDEX_FILE})")]
    for shard, names in sorted(shards.items()):
        path = folder / shard
        if not path.is_file():
            problems.append(Problem(shard, f"missing (named in {INDEX_FILE})"))
            continue
        try:
            header = set(read_header(path))
        except CheckpointError as exc:
            problems.append(Problem(shard, str(exc).removeprefix(f"{path}: ")))
            continue
        if names is None:
            continue
        for missing, what in ((names - header, "lacks"), (header - names, "holds")):
            if missing:
                where = "the index places in it" if what == "lacks" else "the index does not place in it"
                problems.append(
                    Problem(shard, f"corrupt: {what} {len(missing)} tensor(s) {where}, e.g. {min(missing)}")
                )
    return problems


def cache_problems(repo_id: str, snapshot: Path) -> list[Problem]:
    """Against the file list the Hub gave at download time (cached on disk): missing or wrong-sized files."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    try:
        tree = get_cached_repo_tree(repo_id, revision=snapshot.name, cache_dir=hub_cache_dir())
    except (CachedRepoTreeNotFoundError, OSError, ValueError):
        return []
    wanted = set(
        filter_repo_objects([f.path for f in tree], allow_patterns=ENGINE_FILES, ignore_patterns=SKIPPED_FILES)
    )
    problems = []
    for entry in tree:
        if entry.path not in wanted:
            continue
        path = snapshot / entry.path
        if not path.is_file():
            problems.append(Problem(entry.path, "not downloaded"))
        elif entry.size is not None and path.stat().st_size != entry.size:
            problems.append(
                Problem(entry.path, f"truncated or damaged: {path.stat().st_size} bytes, the Hub lists {entry.size}")
            )
    return problems


def hash_problems(snapshot: Path, show_progress: bool = True, verified: frozenset[str] = frozenset()) -> list[Problem]:
    """sha256 of every cached file whose blob is named by its sha256 (the Hub's LFS files).

    `verified`: sha256s already checked while this run downloaded them (not read a second time).
    """
    from huggingface_hub.utils import tqdm

    files = [(p, Path(os.path.realpath(p)).name) for p in sorted(snapshot.iterdir()) if p.is_file()]
    files = [(p, digest) for p, digest in files if SHA256.fullmatch(digest) and digest not in verified]
    problems = []
    with tqdm(
        total=sum(p.stat().st_size for p, _ in files),
        unit="B",
        unit_scale=True,
        desc="Checking sha256",
        disable=not show_progress or None,
    ) as bar:
        for path, digest in files:
            sha = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 24):
                    sha.update(chunk)
                    bar.update(len(chunk))
            if sha.hexdigest() != digest:
                problems.append(Problem(path.name, "corrupt: its sha256 differs from the Hub's"))
    return problems


# --- what is here ----------------------------------------------------------------------------


@dataclass
class ModelEntry:
    name: str  # Hub id, or the folder for a user-added folder
    path: Path
    kind: str  # "target", "drafter", "assistant" or "?"
    size: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.problems


def model_kind(folder: Path) -> str:
    """ "target" (Gemma 4), "drafter" (DFlash), "assistant" (Gemma 4 MTP) or "?" from config.json's
    architecture."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?"
    arch = (raw.get("architectures") or [""])[0] if isinstance(raw, dict) else ""
    if arch in TARGET_ARCHS or (isinstance(raw, dict) and raw.get("model_type") in ("gemma4", "gemma4_text")):
        return "target"
    if arch == "Gemma4AssistantForCausalLM" or (isinstance(raw, dict) and raw.get("model_type") == "gemma4_assistant"):
        return "assistant"
    return "drafter" if arch.startswith("DFlash") else "?"


def added_folders() -> list[Path]:
    try:
        return [Path(p) for p in json.loads(registry_path().read_text(encoding="utf-8")).get("folders", [])]
    except (OSError, ValueError, AttributeError):
        return []


def _save_folders(folders: list[Path]) -> None:
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"folders": [str(p) for p in folders]}, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def add_folder(folder: str | Path) -> Path:
    folder = Path(folder).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise FlashDeskError(f"{folder}: not a model folder (no config.json)")
    folders = added_folders()
    if folder not in folders:
        _save_folders(folders + [folder])
    return folder


def remove_folder(folder: str | Path) -> Path:
    folder = Path(folder).expanduser().resolve()
    folders = added_folders()
    if folder not in folders:
        raise FlashDeskError(f"{folder} is not in the list of added model folders")
    _save_folders([p for p in folders if p != folder])
    return folder


def list_models() -> list[ModelEntry]:
    """Gemma 4 targets, DFlash drafters and MTP assistants in the Hub cache, then the added folders.
    Disk only."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    entries = []
    try:
        repos = sorted(scan_cache_dir(hub_cache_dir()).repos, key=lambda r: r.repo_id.lower())
    except CacheNotFound:
        repos = []
    for repo in repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        snapshot = revision.snapshot_path
        kind = model_kind(snapshot)
        if kind == "?" and repo.repo_id not in KNOWN_REPOS:
            continue
        problems = cache_problems(repo.repo_id, snapshot)
        names = {p.file for p in problems}
        problems += [p for p in check_folder(snapshot) if p.file not in names]
        entries.append(ModelEntry(repo.repo_id, snapshot, kind, revision.size_on_disk, problems))
    for folder in added_folders():
        if not folder.is_dir():
            entries.append(ModelEntry(str(folder), folder, "?", 0, [Problem(".", "folder not found")]))
            continue
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        entries.append(ModelEntry(str(folder), folder, model_kind(folder), size, check_folder(folder)))
    return entries


# --- pull ------------------------------------------------------------------------------------


def _fetch(
    repo_id: str,
    filename: str | None = None,
    revision: str | None = None,
    force: bool = False,
    skip: Sequence[str] = (),
) -> Path:
    """snapshot_download (filename None) or hf_hub_download into the cache; errors as FlashDeskError.

    `skip`: more patterns snapshot_download leaves out (the files `_fetch_resumable` downloads).
    """
    import httpx2
    from huggingface_hub import hf_hub_download, snapshot_download

    cache_dir, endpoint = hub_cache_dir(), hub_endpoint()
    try:
        if filename is None:
            return Path(
                snapshot_download(
                    repo_id,
                    allow_patterns=ENGINE_FILES,
                    ignore_patterns=SKIPPED_FILES + list(skip),
                    cache_dir=cache_dir,
                    endpoint=endpoint,
                    force_download=force,
                )
            )
        return Path(
            hf_hub_download(
                repo_id, filename, revision=revision, cache_dir=cache_dir, endpoint=endpoint, force_download=force
            )
        )
    except (OSError, ValueError, httpx2.HTTPError) as exc:  # HfHubHTTPError and friends are OSErrors
        raise _download_error(repo_id, exc) from exc


def pull(
    repo_id: str,
    force: bool = False,
    repair: Callable[[str, list[Problem]], bool] = lambda r, p: False,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
    progress: Progress | None = None,
    checked: Callable[[str, Path], None] | None = None,
) -> ModelEntry:
    """Download `repo_id`'s engine files, check them, and re-download damaged ones if `repair` agrees.

    The small files go through huggingface_hub's snapshot_download (which also records the commit
    and its file list); then the weights through `_fetch_resumable`, so an interrupted weights file
    continues where it stopped, within the run and on the next run. Finished files are kept.

    `progress(file, done, total)`, when given, is called for each file: the small files once each
    when snapshot_download has them, each weights file once with its size before any weights byte
    is downloaded (so the sum of the totals is known early) and then as its bytes arrive. An
    exception it raises stops the pull (a weights file cut off keeps its partial bytes for later).

    `checked(repo_id, snapshot)`, when given, is called once the small files are in and before
    any weights byte: where the callers run `models verify` (verify.check_snapshot), so that what
    the engine would make of the checkpoint is known before the weights arrive.
    """
    log(f"Pulling {repo_id} from {hub_endpoint()} into {hub_cache_dir()}")
    snapshot = _fetch(repo_id, force=force, skip=RESUMABLE_FILES)
    if progress is not None:
        _report_small_files(repo_id, snapshot, progress)
    if checked is not None:
        checked(repo_id, snapshot)
    verified = _fetch_resumable(
        repo_id, snapshot, replace=force, fresh=force, show_progress=show_progress, log=log, progress=progress
    )
    problems = _check_download(repo_id, snapshot, show_progress, verified)
    if problems and repair(repo_id, problems):
        for p in problems:
            log(f"Re-downloading {repo_id}/{p.file} ({p.message})")
            if _is_resumable(p.file):
                verified |= _fetch_resumable(
                    repo_id,
                    snapshot,
                    only=[p.file],
                    replace=True,
                    show_progress=show_progress,
                    log=log,
                    progress=progress,
                )
            else:
                path = _fetch(repo_id, p.file, revision=snapshot.name, force=True)
                if progress is not None:
                    progress(p.file, path.stat().st_size, path.stat().st_size)
        problems = _check_download(repo_id, snapshot, show_progress, verified)
    size = sum(p.stat().st_size for p in snapshot.iterdir() if p.is_file())
    return ModelEntry(repo_id, snapshot, model_kind(snapshot), size, problems)


def _report_small_files(repo_id: str, snapshot: Path, progress: Progress) -> None:
    """After snapshot_download: every engine file of the commit's listing at once, the ones in the
    snapshot as finished (the small files it just brought or found, weights complete from before),
    the weights still to come with their listed size, so that the sum of the totals is known before
    the first weights byte. Without a cached listing, the files in the snapshot."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    try:
        tree = get_cached_repo_tree(repo_id, revision=snapshot.name, cache_dir=hub_cache_dir())
        listed = {entry.path: entry.size or 0 for entry in tree}
    except (CachedRepoTreeNotFoundError, OSError, ValueError):
        listed = {path.name: 0 for path in snapshot.iterdir()}
    wanted = sorted(
        filter_repo_objects(list(listed), allow_patterns=ENGINE_FILES, ignore_patterns=SKIPPED_FILES),
        key=lambda name: (not _is_resumable(name), name),
    )
    for name in wanted:
        path = snapshot / name
        size = path.stat().st_size if path.is_file() else 0
        progress(name, size, max(size, listed[name]))


def _check_download(
    repo_id: str, snapshot: Path, show_progress: bool, verified: Collection[str] = frozenset()
) -> list[Problem]:
    problems = cache_problems(repo_id, snapshot)
    problems += check_folder(snapshot)
    problems += hash_problems(snapshot, show_progress, frozenset(verified))
    seen, unique = set(), []
    for p in problems:  # one line per file: the first finding is the clearest
        if p.file not in seen:
            seen.add(p.file)
            unique.append(p)
    return unique


# --- the CLI ---------------------------------------------------------------------------------


def run_models(args, checked: Callable[[str, Path], None] | None = None) -> int:
    """`flashdesk models pull|list|add|remove`: 0 when all is well, 1 when a model is incomplete.
    `checked`: pull's hook once a repository's small files are in (the CLI prints `models verify`'s
    answer there)."""
    if args.models_command == "add":
        print(f"added {add_folder(args.dir)}")
        return 0
    if args.models_command == "remove":
        print(f"removed {remove_folder(args.dir)}")
        return 0
    if args.models_command == "list":
        entries = list_models()
        if args.json:
            print(
                json.dumps(
                    [
                        {
                            "name": e.name,
                            "path": str(e.path),
                            "kind": e.kind,
                            "size": e.size,
                            "complete": e.complete,
                            "problems": [str(p) for p in e.problems],
                        }
                        for e in entries
                    ],
                    indent=2,
                )
            )
            return 0
        if not entries:
            print(f"no models in {hub_cache_dir()} and no added folders; run `flashdesk models pull`")
        for e in entries:
            print(f"{e.name:<44} {e.kind:<8} {_size(e.size):>9}  {'complete' if e.complete else 'incomplete'}")
            print(f"    {e.path}")
            for p in e.problems:
                print(f"    {p}")
        return 0

    def ask(repo_id: str, problems: list[Problem]) -> bool:
        if args.yes or not sys.stdin.isatty():
            return args.yes
        for p in problems:
            print(f"flashdesk models pull: {repo_id}: {p}", file=sys.stderr)
        answer = input(f"Re-download {len({p.file for p in problems})} damaged file(s) of {repo_id}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    status = 0
    pulled = []
    for repo_id in args.repo_ids or DEFAULT_REPOS:
        try:
            entry = pull(
                repo_id, force=args.force, repair=ask, log=lambda s: print(s, file=sys.stderr), checked=checked
            )
        except KeyboardInterrupt:
            print(
                f"\n{repo_id}: interrupted; run the same command again to continue (finished files are "
                "kept, and a weights file cut off half-way continues where it stopped)",
                file=sys.stderr,
            )
            return 130
        pulled.append(repo_id)
        if entry.complete:
            print(f"{repo_id}: complete, {_size(entry.size)} in {entry.path}")
        else:
            for p in entry.problems:
                print(f"flashdesk models pull: {repo_id}: {p}", file=sys.stderr)
            print(
                f"{repo_id}: incomplete; run `flashdesk models pull {repo_id} --yes` to re-download the "
                "damaged file(s), or `--force` to re-download everything",
                file=sys.stderr,
            )
            status = 1
    offer = assistant_offer(pulled)
    if offer:
        print(offer)
    return status


def assistant_offer(pulled: list[str]) -> str | None:
    """After a pull of the recommended target or drafter: the line that offers Gemma 4's MTP
    assistant, unless it was pulled too or is already in the cache (a disk-only look)."""
    if ASSISTANT_REPO in pulled or not set(pulled) & set(DEFAULT_REPOS):
        return None
    try:
        resolve_model_path(ASSISTANT_REPO)
        return None  # already here
    except FlashDeskError:
        pass
    return (
        f"Also available: Gemma 4's own MTP assistant for this model ({_size(ASSISTANT_BYTES)}), a second "
        f"drafter to compare with DFlash: flashdesk models pull {ASSISTANT_REPO}"
    )
