"""`flashdesk models`: pull through huggingface_hub from a fake Hub on 127.0.0.1, check, list, resolve.

The fake Hub (tests/fake_hub.py) serves a tiny sharded Gemma 4 checkpoint and a tiny DFlash drafter
under the two default repository ids, plus files the engine must not fetch. HF_ENDPOINT points at
it and HF_HUB_CACHE at a temporary folder; the real Hub is never contacted. list / resolve are run
with every outgoing TCP connection refused, to show they stay on the disk.

The weights are downloaded by FlashDesk itself so that an interrupted pull continues on the next
run: those tests check the partial file it keeps (`blobs/{etag}.incomplete`), the Range request
of the next run, and that the result is the layout huggingface_hub's own cache functions read.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from fake_hub import FakeHub, point_at

from flashdesk.engine.hub import models
from flashdesk.engine.cli.main import main
from flashdesk.engine.errors import FlashDeskError

TARGET, DRAFT = models.DEFAULT_REPOS
UNNEEDED = {
    "README.md": b"# card\n",
    "images/diagram.png": b"\x89PNG fake",
    "model.onnx": b"onnx",
    "model.gguf": b"gguf",
    "pytorch_model.bin": b"pickle",
    "original/model.safetensors": b"other",
    "onnx/model.onnx": b"onnx",
    ".gitattributes": b"*.safetensors filter=lfs\n",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The files of a tiny sharded target and a tiny drafter, as {path: bytes}."""
    from tiny_checkpoints import write_checkpoint
    from tiny_drafter import write_drafter

    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    write_checkpoint(target, shard=True)
    write_drafter(draft, seed=3)
    read = lambda folder: {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}  # noqa: E731
    return read(target), read(draft)


@pytest.fixture
def hub(checkpoints, tmp_path, monkeypatch):
    """A fake Hub serving both default repositories; the HF cache and FlashDesk's config in tmp_path."""
    target, draft = checkpoints
    with FakeHub() as server:
        server.add_repo(TARGET, {**target, **UNNEEDED})
        server.add_repo(DRAFT, {**draft, "README.md": b"# drafter\n"})
        point_at(server, tmp_path, monkeypatch)
        yield server


def block_network(monkeypatch) -> None:
    """Refuse every outgoing TCP connection from now on (unix sockets still work)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access to {address} where none is allowed")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def no_network(monkeypatch):
    block_network(monkeypatch)


def closed_port_url() -> str:
    """An endpoint on 127.0.0.1 where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def shards(files: dict) -> list[str]:
    return sorted(p for p in files if p.startswith("model-") and p.endswith(".safetensors"))


def pull(repo_id, **kw):
    return models.pull(repo_id, show_progress=False, log=lambda s: None, **kw)


def repo_folder(repo_id: str):
    return models.hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def partial_of(repo_id: str, data: bytes):
    """Where a half-downloaded weights file is kept between runs: blobs/{etag}.incomplete."""
    return repo_folder(repo_id) / "blobs" / f"{hashlib.sha256(data).hexdigest()}.incomplete"


def range_start(range_header: str | None) -> int | None:
    return None if range_header is None else int(range_header.removeprefix("bytes=").rstrip("-"))


def interrupt_pull(hub, shard: str) -> None:
    """A pull that ends with `shard` half-downloaded: the connection is cut half-way, the retry fails."""
    hub.drop_once(shard)
    hub.fail_gets(shard)
    with pytest.raises(FlashDeskError, match="Run the same command again"):
        pull(TARGET)
    hub.fail_gets(shard, False)
    hub.log.clear()


def test_pull_fetches_only_the_engine_files_and_they_check(hub, checkpoints):
    target, _ = checkpoints
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert entry.kind == "target"
    on_disk = {p.name: p.read_bytes() for p in entry.path.iterdir() if p.is_file()}
    assert on_disk == target  # every needed file, byte for byte
    assert not (entry.path / "original").exists() and not (entry.path / "images").exists()
    fetched = {path for path, _ in hub.gets()}
    assert fetched == set(target)
    assert not fetched & set(UNNEEDED)
    assert len(shards(target)) > 3  # the tiny checkpoint really is sharded
    assert entry.path.parent.parent.parent == models.hub_cache_dir()  # the standard cache layout


def test_default_repos_from_the_cli(hub, capsys):
    assert main(["models", "pull"]) == 0
    out = capsys.readouterr().out
    assert f"{TARGET}: complete" in out and f"{DRAFT}: complete" in out


def test_cache_layout_is_huggingface_hubs(hub, checkpoints):
    """The weights FlashDesk downloads itself sit where huggingface_hub puts them, and its own cache
    functions find them (offline)."""
    from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache

    target, _ = checkpoints
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    commit = entry.path.name
    folder = repo_folder(TARGET)
    assert entry.path == folder / "snapshots" / commit
    assert (folder / "refs" / "main").read_text() == commit
    for shard in shards(target):
        pointer = entry.path / shard
        etag = hashlib.sha256(target[shard]).hexdigest()
        assert pointer.is_symlink() and os.readlink(pointer) == f"../../blobs/{etag}"
        assert (folder / "blobs" / etag).read_bytes() == target[shard]
        cache = models.hub_cache_dir()
        assert hf_hub_download(TARGET, shard, cache_dir=cache, local_files_only=True) == str(pointer)
        assert try_to_load_from_cache(TARGET, shard, cache_dir=cache) == str(pointer)
    assert not list((folder / "blobs").glob("*.incomplete"))
    info = scan_cache_dir(models.hub_cache_dir())
    assert not info.warnings and not info.incomplete_files
    (repo,) = [r for r in info.repos if r.repo_id == TARGET]
    (revision,) = repo.revisions
    assert revision.commit_hash == commit and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} == set(target)
    assert revision.size_on_disk == sum(len(d) for d in target.values())
    assert models.resolve_model_path(TARGET) == entry.path


def test_connection_cut_half_way_resumes_with_a_range_request(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[2]
    hub.drop_once(shard)
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert (entry.path / shard).read_bytes() == target[shard]
    gets = hub.gets(shard)
    assert len(gets) == 2 and gets[0][1] is None
    assert range_start(gets[1][1]) == len(target[shard]) // 2  # continued where the cut left it


def test_interrupted_pull_continues_on_the_next_run(hub, checkpoints, monkeypatch):
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.utils import tqdm

    target, _ = checkpoints
    shard = shards(target)[1]
    hub.drop_once(shard)
    hub.fail_gets(shard)  # the retry fails too: this run ends with the shard half-downloaded
    with pytest.raises(FlashDeskError, match="Run the same command again"):
        pull(TARGET)
    partial = partial_of(TARGET, target[shard])
    kept = partial.read_bytes()
    assert kept == target[shard][: len(target[shard]) // 2]  # every byte received is kept, in order
    assert {f.file_path for f in scan_cache_dir(models.hub_cache_dir()).incomplete_files} == {partial}
    (listed,) = [e for e in models.list_models() if e.name == TARGET]
    assert not listed.complete and any(p.file == shard for p in listed.problems)
    with pytest.raises(FlashDeskError, match="partly downloaded"):
        models.resolve_model_path(TARGET)
    before = {p.name for p in listed.path.iterdir()}
    assert shard not in before and "config.json" in before
    hub.log.clear()
    hub.fail_gets(shard, False)
    bars = []

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            bars.append(kwargs)
            super().__init__(*args, **kwargs)

    import importlib

    # the module, not `huggingface_hub.utils.tqdm` (which that package always answers with the class)
    monkeypatch.setattr(importlib.import_module("huggingface_hub.utils.tqdm"), "tqdm", Bar)
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert (entry.path / shard).read_bytes() == target[shard]
    assert hub.gets(shard) == [(shard, f"bytes={len(kept)}-")]  # one request, for the rest only
    refetched = {path for path, _ in hub.gets()}
    assert not refetched & before  # finished files are kept
    assert refetched == {shard} | (set(shards(target)) - before)  # the shards the first run had not reached
    (bar,) = [b for b in bars if b.get("desc") == shard]
    assert bar["initial"] == len(kept) and bar["total"] == len(target[shard])  # progress from the kept bytes
    assert not partial.exists()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_pull_stopped_mid_file_continues_on_the_next_run(hub, checkpoints, tmp_path, how):
    """`flashdesk models pull` in its own process, stopped while a shard is arriving."""
    target, _ = checkpoints
    shard = shards(target)[3]
    sent = len(target[shard]) // 3
    hub.stall_once(shard, sent)
    env = {**os.environ, "HF_HUB_DOWNLOAD_TIMEOUT": "60", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    # a shell that runs the suite in the background ignores SIGINT, and children inherit that: give the
    # pull the disposition of a terminal's foreground command, where Ctrl-C arrives
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashdesk", "models", "pull", TARGET],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    partial = partial_of(TARGET, target[shard])
    try:
        deadline = time.monotonic() + 60
        while not (partial.is_file() and partial.stat().st_size == sent):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the stalled shard never reached the disk"
            time.sleep(0.02)
        proc.send_signal(how)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        hub.release()
    if how == signal.SIGINT:
        assert proc.returncode == 130, err
        assert "interrupted" in err and "continues where it stopped" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    assert partial.read_bytes() == target[shard][:sent]
    hub.log.clear()
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert hub.gets(shard) == [(shard, f"bytes={sent}-")]
    assert (entry.path / shard).read_bytes() == target[shard]
    assert not partial.exists()


def test_server_that_ignores_range_still_gives_the_right_file(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[0]
    interrupt_pull(hub, shard)
    kept = partial_of(TARGET, target[shard]).stat().st_size
    hub.ignore_range = True  # answers the Range request with the whole file (200)
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert hub.gets(shard) == [(shard, f"bytes={kept}-")]  # the 200's body is used, not appended
    assert (entry.path / shard).read_bytes() == target[shard]
    assert not partial_of(TARGET, target[shard]).exists()


def test_partial_larger_than_the_file_starts_over(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[4]
    partial = partial_of(TARGET, target[shard])
    partial.parent.mkdir(parents=True)
    partial.write_bytes(target[shard] + b"junk")
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert hub.gets(shard) == [(shard, None)]
    assert (entry.path / shard).read_bytes() == target[shard]


def test_damaged_partial_is_caught_by_the_sha256_and_downloaded_again(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[4]
    partial = partial_of(TARGET, target[shard])
    partial.parent.mkdir(parents=True)
    half = len(target[shard]) // 2
    partial.write_bytes(bytes(half))  # the right length, the wrong bytes (e.g. a crash before a disk flush)
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert hub.gets(shard) == [(shard, f"bytes={half}-"), (shard, None)]
    assert (entry.path / shard).read_bytes() == target[shard]


def test_interrupted_repair_continues_but_force_starts_over(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[6]
    blob = (pull(TARGET).path / shard).resolve()
    blob.write_bytes(blob.read_bytes()[:1000])  # damaged on disk after the download
    hub.drop_once(shard)
    hub.fail_gets(shard)
    with pytest.raises(FlashDeskError, match="Run the same command again"):
        pull(TARGET, repair=lambda repo_id, problems: True)  # the re-download is cut off half-way
    hub.fail_gets(shard, False)
    half = len(target[shard]) // 2
    assert partial_of(TARGET, target[shard]).stat().st_size == half
    hub.log.clear()
    entry = pull(TARGET, repair=lambda repo_id, problems: True)
    assert entry.complete, entry.problems
    assert hub.gets() == [(shard, f"bytes={half}-")]
    assert (entry.path / shard).read_bytes() == target[shard]
    # --force downloads everything from zero, a partial file included
    partial = partial_of(TARGET, target[shard])
    partial.write_bytes(target[shard][:half])
    hub.log.clear()
    assert main(["models", "pull", TARGET, "--force"]) == 0
    assert hub.gets(shard) == [(shard, None)] and not partial.exists()


def test_partial_of_a_file_changed_on_the_hub_is_not_reused(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[2]
    interrupt_pull(hub, shard)
    old_partial = partial_of(TARGET, target[shard])
    assert old_partial.is_file()
    before = {p.name for p in (repo_folder(TARGET) / "snapshots" / hub.commits[TARGET]).iterdir()}
    changed = target[shard][:-64] + bytes(64)  # same header, other weights: a new commit on the Hub
    hub.add_repo(TARGET, {**target, shard: changed, **UNNEEDED})
    entry = pull(TARGET)
    assert entry.complete, entry.problems
    assert hub.gets(shard) == [(shard, None)]  # from zero: the old bytes belong to another file
    assert (entry.path / shard).read_bytes() == changed
    assert not old_partial.exists()  # removed, not left to fill the disk
    others = {path for path, _ in hub.gets()} - {shard}
    assert others == set(shards(target)) - before - {shard}  # what the first run had finished is reused


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda data: data[:8] + b"\xff" * 32 + data[40:], "corrupt safetensors header"),  # garbled header
        (lambda data: data[:-64] + bytes(64), "sha256"),  # header intact, tensor bytes wrong
    ],
)
def test_corrupted_download_is_named_and_repaired(hub, checkpoints, capsys, damage, says):
    target, _ = checkpoints
    shard = shards(target)[3]
    hub.corrupt(TARGET, shard, damage(target[shard]))
    entry = pull(TARGET)
    assert [p.file for p in entry.problems] == [shard]
    assert says in entry.problems[0].message
    assert main(["models", "pull", TARGET]) == 1  # not a terminal and no --yes: reported, not repaired
    err = capsys.readouterr().err
    assert shard in err and "--yes" in err
    hub.corrupt(TARGET, shard, None)
    hub.log.clear()
    assert main(["models", "pull", TARGET, "--yes"]) == 0
    assert [path for path, _ in hub.gets()] == [shard]  # only the damaged file again
    assert (entry.path / shard).read_bytes() == target[shard]


def test_pull_repairs_a_file_damaged_on_disk(hub, checkpoints):
    target, _ = checkpoints
    shard = shards(target)[5]
    blob = (pull(TARGET).path / shard).resolve()
    blob.write_bytes(blob.read_bytes()[: len(target[shard]) // 3])
    hub.log.clear()
    entry = pull(TARGET, repair=lambda repo_id, problems: [p.file for p in problems] == [shard])
    assert entry.complete, entry.problems
    assert [path for path, _ in hub.gets()] == [shard]
    assert (entry.path / shard).read_bytes() == target[shard]


def test_force_redownloads_everything(hub, checkpoints):
    target, _ = checkpoints
    pull(TARGET)
    hub.log.clear()
    assert main(["models", "pull", TARGET, "--force"]) == 0
    assert {path for path, _ in hub.gets()} == set(target)


def test_list_shows_kind_size_and_state(hub, checkpoints, tmp_path, capsys, monkeypatch):
    target, _ = checkpoints
    pull(TARGET)
    pull(DRAFT)
    # an unrelated model in the same cache is not listed
    hub.add_repo("someone/bert", {"config.json": json.dumps({"architectures": ["BertModel"]}).encode()})
    models._fetch("someone/bert")
    # a folder of the user's own, with one shard missing
    own = tmp_path / "own-model"
    own.mkdir()
    for name, data in target.items():
        (own / name).write_bytes(data)
    missing = shards(target)[0]
    (own / missing).unlink()
    assert main(["models", "add", str(own)]) == 0
    # a truncated shard in the cache (disk damage after the download)
    blob = (models.resolve_model_path(TARGET) / shards(target)[4]).resolve()
    blob.write_bytes(blob.read_bytes()[:1000])
    block_network(monkeypatch)
    entries = {e.name: e for e in models.list_models()}
    assert set(entries) == {TARGET, DRAFT, str(own)}
    assert entries[DRAFT].complete and entries[DRAFT].kind == "drafter"
    assert entries[DRAFT].size == sum(len(d) for d in checkpoints[1].values())
    assert not entries[TARGET].complete
    assert [p.file for p in entries[TARGET].problems] == [shards(target)[4]]
    assert "truncated" in entries[TARGET].problems[0].message
    assert not entries[str(own)].complete and entries[str(own)].kind == "target"
    assert [p.file for p in entries[str(own)].problems] == [missing]
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "incomplete" in out and f"{missing}: missing" in out
    assert main(["models", "list", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert listed[DRAFT]["complete"] and not listed[TARGET]["complete"]
    assert main(["models", "remove", str(own)]) == 0
    assert str(own) not in {e.name for e in models.list_models()}
    assert models.registry_path().is_relative_to(tmp_path / "config")


def test_resolve_model_path_offline(hub, checkpoints, tmp_path, monkeypatch, no_network):
    folder = tmp_path / "plain-folder"
    folder.mkdir()
    assert models.resolve_model_path(str(folder)) == folder
    with pytest.raises(FlashDeskError, match=f"flashdesk models pull {TARGET}"):
        models.resolve_model_path(TARGET)  # not pulled yet, and no network to find out more
    missing = tmp_path / "not" / "there"  # not a Hub id: left for the loader to report
    assert models.resolve_model_path(str(missing)) == missing


def test_hub_id_works_as_model_and_draft_offline(hub, checkpoints, tmp_path, monkeypatch, capsys):
    target_dir = pull(TARGET).path
    draft_dir = pull(DRAFT).path
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    hub.close()
    block_network(monkeypatch)
    assert models.resolve_model_path(TARGET) == target_dir
    assert models.resolve_model_path(DRAFT) == draft_dir
    args = ["--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--ignore-eos", "--device", "cpu", "--json"]
    assert main(["generate", "--model", TARGET, "--draft", DRAFT, *args]) == 0
    by_id = json.loads(capsys.readouterr().out)
    assert main(["generate", "--model", str(target_dir), *args]) == 0
    by_folder = json.loads(capsys.readouterr().out)
    assert by_id["token_ids"] == by_folder["token_ids"] and len(by_id["token_ids"]) == 4


def test_pull_with_the_hub_unreachable_says_so(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    with pytest.raises(FlashDeskError, match="cannot reach"):
        pull(TARGET)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(FlashDeskError, match="no such model"):
        pull("nobody/nothing")
