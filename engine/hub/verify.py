"""`flashdesk models verify PATH_OR_REPO`: can the engine run this checkpoint, with which kernels, at
which context on this card, and what would it refuse? Read from the configs and the safetensors
headers alone.

Why its own module: the answer is wanted before a download of many gigabytes, from a Hub id as well
as from a folder, so no weights byte is read. For a repository the small files come as a pull
brings them (config, tokenizer, index, into the Hugging Face cache) and each weights file's header
by one or two bounded HTTP Range requests (`HubHeaders`). The checks are the loader's own
(`checkpoint.inspect_checkpoint`: config, quantization scheme, every tensor's name, shape and dtype,
the memory plan), so a checkpoint that passes here is one the engine loads.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from flashdesk.engine.errors import CheckpointError, FlashDeskError
from flashdesk.engine.hub.hub_download import RESUMABLE_FILES, SKIPPED_FILES, hub_cache_dir, hub_endpoint
from flashdesk.engine.loading.weights import TensorEntry, parse_header

MAX_HEADER_BYTES = 100 << 20  # a safetensors header past this is not one (safetensors' own limit)
HEADER_PROBE = 1 << 16  # the first request's bytes: a shard's whole header, mostly


class HubHeaders:
    """The safetensors headers of a Hub repository's commit, read by bounded Range requests, for the
    files not in `snapshot` yet (`weights.RemoteHeaders`). The file list and sizes are those the
    snapshot's download cached."""

    def __init__(self, repo_id: str, snapshot: Path):
        from huggingface_hub import get_cached_repo_tree
        from huggingface_hub.errors import CachedRepoTreeNotFoundError
        from huggingface_hub.utils import filter_repo_objects

        self.repo_id, self.snapshot = repo_id, snapshot
        try:
            tree = get_cached_repo_tree(repo_id, revision=snapshot.name, cache_dir=hub_cache_dir())
        except (CachedRepoTreeNotFoundError, OSError, ValueError) as exc:
            raise FlashDeskError(
                f"{repo_id}: the file list of its commit is not cached ({exc}); "
                f"run `flashdesk models pull {repo_id}` instead"
            ) from exc
        sizes = {entry.path: entry.size or 0 for entry in tree}
        names = filter_repo_objects(list(sizes), allow_patterns=RESUMABLE_FILES, ignore_patterns=SKIPPED_FILES)
        self.sizes = {name: sizes[name] for name in names}

    def files(self) -> list[str]:
        return sorted(self.sizes)

    def header(self, name: str) -> dict[str, TensorEntry]:
        import httpx2

        where = f"{self.repo_id}/{name}"
        try:
            raw = self._bytes(name, 0, HEADER_PROBE)
            if len(raw) < 8:
                raise CheckpointError(f"{where}: truncated safetensors file (no header)")
            (length,) = struct.unpack("<Q", raw[:8])
            if length > MAX_HEADER_BYTES:
                raise CheckpointError(f"{where}: not a safetensors file (a header of {length} bytes)")
            if len(raw) < 8 + length:
                raw += self._bytes(name, len(raw), 8 + length)
        except (OSError, ValueError, httpx2.HTTPError) as exc:
            if isinstance(exc, CheckpointError):
                raise
            raise FlashDeskError(
                f"{where}: cannot read its header from {hub_endpoint()}: {type(exc).__name__}: {exc}"
            ) from exc
        if len(raw) < 8 + length:
            raise CheckpointError(f"{where}: truncated safetensors file (the header ends past the file)")
        size = self.sizes.get(name, 0)
        return parse_header(raw[8 : 8 + length], size - 8 - length, self.snapshot / name, where)

    def _bytes(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file (fewer at its end), by a bounded Range request; from a
        server that ignores the Range, the same bytes out of the whole body, the rest unread."""
        from huggingface_hub import constants, get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = hf_hub_url(self.repo_id, name, revision=self.snapshot.name, endpoint=hub_endpoint())
        headers = build_hf_headers()
        headers.update({"Accept-Encoding": "identity", "Range": f"bytes={start}-{end - 1}"})
        got = b""
        with get_session().stream("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
            hf_raise_for_status(response)
            skip = start if response.status_code == 200 else 0  # the whole file came: from byte 0
            for chunk in response.iter_bytes():
                got += chunk
                if len(got) >= skip + end - start:
                    break
        return got[skip : skip + end - start]


@dataclass
class Verification:
    """What `models verify` found: `ok` when the engine would load and run the checkpoint."""

    source: str
    folder: str | None = None
    kind: str = "?"  # "target", "drafter", "assistant" or "?"
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    formats: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    device: str = "cpu"
    memory: dict | None = None
    gpu: dict | None = None
    checked: bool = True  # False where the check could not be made (lines say why)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict:
        return {
            "source": self.source,
            "folder": self.folder,
            "kind": self.kind,
            "ok": self.ok,
            "checked": self.checked,
            "problems": self.problems,
            "formats": self.formats,
            "kernels": self.kernels,
            "device": self.device,
            "memory": self.memory,
            "gpu": self.gpu,
            "lines": self.lines,
        }


def kernel_plan(formats: list[dict], device: str) -> list[dict]:
    """Which kernel runs each kind of weight, and where: the Triton path on a CUDA card (minus the
    families this card's kept self-tests sent back to torch), torch elsewhere."""
    fallbacks = _kept_fallbacks() if device == "cuda" else set()

    def row(family: str, weights: str, fmt: str, modules: int | None, triton: str | None, torch: str) -> dict:
        if device == "cuda" and triton and family not in fallbacks:
            return {
                "family": family,
                "weights": weights,
                "format": fmt,
                "modules": modules,
                "kernel": triton,
                "runs_on": "triton",
            }
        why = " (failed its self-test on this card)" if device == "cuda" and family in fallbacks else ""
        return {
            "family": family,
            "weights": weights,
            "format": fmt,
            "modules": modules,
            "kernel": torch + why,
            "runs_on": "torch",
        }

    plan = []
    for f in formats:
        int4 = f["format"].startswith("int4")
        if f["weights"] == "linear":
            plan.append(
                row(
                    "linear",
                    "linear",
                    f["format"],
                    f["modules"],
                    "W4A16 GEMV, int4 read packed" if int4 else "16-bit GEMV",
                    "torch matmul, dequantized per call" if int4 else "torch matmul",
                )
            )
        else:
            plan.append(
                row(
                    "moe",
                    "experts",
                    f["format"],
                    f["modules"],
                    "fused int4 experts (router, gate_up, down)" if int4 else None,
                    "torch experts, dequantized per call" if int4 else "torch experts",
                )
            )
    kv = "fp8" if device == "cuda" else "float32"
    plan.append(
        row(
            "decode_attention",
            "KV cache",
            kv,
            None,
            "split decode attention, reads the cache in place",
            "torch attention",
        )
    )
    return plan


def _kept_fallbacks() -> set[str]:
    """The kernel families this card's last self-test sent back to torch (none when never run)."""
    try:
        import torch

        from flashdesk.kernels.self_test import kept_results

        kept = kept_results(torch.device("cuda"))
    except Exception:  # noqa: BLE001 - without a kept result, the plan says triton
        return set()
    return {r.name for r in (kept[0] if kept else []) if not r.ok}


def _source_folder(source: str, log) -> tuple[Path, object]:
    """(folder, remote headers or None): a folder as is; a Hub id's snapshot, its small files
    fetched as a pull fetches them, and its weights' headers remote where not downloaded."""
    from flashdesk.engine.hub.models import REPO_ID, _fetch

    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder, None
    if not REPO_ID.fullmatch(source):
        raise FlashDeskError(f"{source}: no such folder, and not a Hugging Face model id (they look like org/name)")
    log(f"Reading the configs and safetensors headers of {source} from {hub_endpoint()} (no weights)")
    snapshot = _fetch(source, skip=RESUMABLE_FILES)
    return snapshot, HubHeaders(source, snapshot)


def verify(
    source: str, context: int | None = None, log=lambda text: None, folder: Path | None = None, remote=None
) -> Verification:
    """Check `source` (a folder or a Hub id) as the loader would, without reading weights. `folder`
    and `remote` skip the lookup (a pull that has the small files already)."""
    from flashdesk.engine.decode.generation import resolve_device
    from flashdesk.engine.hub.models import model_kind
    from flashdesk.engine.loading.checkpoint import inspect_assistant, inspect_checkpoint, inspect_drafter

    result = Verification(source)
    try:
        if folder is None:
            folder, remote = _source_folder(source, log)
        result.folder = str(folder)
        result.kind = model_kind(folder)
        result.device = resolve_device("auto").type
        if result.kind == "drafter":
            report = inspect_drafter(folder, remote=remote)
        elif result.kind == "assistant":
            report = inspect_assistant(folder, remote=remote)
        else:
            report = inspect_checkpoint(folder, context, device=result.device, remote=remote)
    except FlashDeskError as exc:
        result.problems.append(str(exc))
        result.lines.append(f"problem  {exc}")
        return result
    result.lines, result.problems, result.formats = list(report.lines), list(report.problems), report.formats
    if result.kind == "target":
        result.kernels = kernel_plan(report.formats, result.device)
        width = max(len(label) for label, _ in report.rows)
        at = len(result.lines) - 1  # before the verdict
        for row in result.kernels:
            count = f"{row['modules']} x " if row["modules"] else ""
            text = f"{count}{row['weights']}, {row['format']}: {row['kernel']} ({row['runs_on']})"
            result.lines.insert(at, f"{'kernels' if row is result.kernels[0] else '':<{width}}  {text}")
            at += 1
    if report.memory is not None:
        result.memory = {"context": report.memory.context, "bytes": report.memory.total}
    result.gpu = report.gpu
    return result


def check_snapshot(repo_id: str, snapshot: Path) -> Verification:
    """`verify` on a repository being pulled, its small files in and its weights not yet: the
    headers come from the Hub. A check that cannot be made says so in its lines, with no problem
    (it proves nothing either way), and never stops the download."""
    try:
        return verify(repo_id, folder=snapshot, remote=HubHeaders(repo_id, snapshot))
    except Exception as exc:  # noqa: BLE001 - the download goes on without the check
        return Verification(repo_id, str(snapshot), lines=[f"not checked before the download: {exc}"], checked=False)


def print_check(verification: Verification) -> None:
    """`models pull`'s one or two lines on what verify found, before the weights."""
    import sys

    source = verification.source
    if not verification.checked:
        print(f"{source}: {verification.lines[0]}", file=sys.stderr)
    elif verification.ok:
        print(f"{source}: checked from its configs and headers: FlashDesk can run it", file=sys.stderr)
    else:
        for problem in verification.problems:
            print(f"flashdesk models pull: {source}: FlashDesk would refuse it: {problem}", file=sys.stderr)
        print("downloading anyway (Ctrl-C stops; what is downloaded is kept)", file=sys.stderr)


def run_verify(args) -> int:
    """`flashdesk models verify`: 0 when the engine can run the checkpoint, 1 when it would refuse it."""
    import json
    import sys

    result = verify(args.source, args.context, log=lambda text: print(text, file=sys.stderr))
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print("\n".join(result.lines))
    return 0 if result.ok else 1
