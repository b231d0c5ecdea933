"""A fake Hugging Face Hub on 127.0.0.1: just the endpoints huggingface_hub's downloads call.

Why: `flashdesk models pull` goes through huggingface_hub's own snapshot_download, and the only
honest test of that is the same client against a server. The real Hub is never reachable from
the build machines (and must never be contacted by a test), so this serves the few routes
snapshot_download / hf_hub_download use (read from huggingface_hub 2.4's source):

- `GET /api/models/{repo}/revision/{rev}` (repo_info): the commit sha;
- `GET /api/models/{repo}/tree/{rev}?recursive=...` (list_repo_tree): one page, no Link header;
- `HEAD /{repo}/resolve/{rev}/{path}` (get_hf_file_metadata): X-Repo-Commit, ETag (the sha256 for
  LFS files, like the Hub), X-Linked-Size / Content-Length;
- `GET /{repo}/resolve/{rev}/{path}` (http_get), with `Range: bytes=N-` answered by 206; a bounded
  `Range: bytes=A-B` (`models verify` reading a header) gets that slice, and no fault below.

Faults, to test the client's recovery: `drop_once(path)` sends half of a file then closes the
connection (once); `stall_once(path, n)` sends the first n bytes then sends nothing more until
`release()` (or 30 s), for a test to interrupt the client mid-file; `fail_gets(path)` answers that
file's GETs with 500 until cleared; `ignore_range = True` answers a `Range` request with the whole
file (200), as some proxies and CDNs do; `corrupt(repo, path, data)` serves other bytes under the
real file's ETag and size. Every request is logged as (method, url path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".onnx", ".gguf", ".png", ".jpg")


class FakeHub:
    """Serve repositories {repo_id: {path: bytes}} on 127.0.0.1 until `close()`."""

    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: dict[str, str] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.dropping: set[str] = set()
        self.failing: set[str] = set()
        self.corrupted: dict[tuple[str, str], bytes] = {}
        self.stalling: dict[str, int] = {}
        self.released = threading.Event()
        self.ignore_range = False
        self.lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            fake = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> None:
        self.repos[repo_id] = dict(files)
        digest = hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values())))
        self.commits[repo_id] = digest.hexdigest()

    def add_folder(self, repo_id: str, folder: Path, extra: dict[str, bytes] | None = None) -> None:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        self.add_repo(repo_id, {**files, **(extra or {})})

    def drop_once(self, path: str) -> None:
        self.dropping.add(path)

    def stall_once(self, path: str, after: int) -> None:
        """The next GET of `path` sends its first `after` body bytes, then waits for `release()`."""
        self.released.clear()
        self.stalling[path] = after

    def release(self) -> None:
        self.released.set()

    def fail_gets(self, path: str, failing: bool = True) -> None:
        """Answer GETs of `path` with 500 (after any pending drop_once) until called with False."""
        (self.failing.add if failing else self.failing.discard)(path)

    def corrupt(self, repo_id: str, path: str, data: bytes | None) -> None:
        """Serve `data` as the body of `path` while announcing the real file's ETag, size and
        listing, as a damaged transfer would; None serves the real bytes again."""
        if data is None:
            self.corrupted.pop((repo_id, path), None)
        else:
            assert len(data) == len(self.repos[repo_id][path]), "a corrupted body keeps the announced size"
            self.corrupted[(repo_id, path)] = data

    def gets(self, path: str | None = None) -> list[tuple[str, str | None]]:
        """The resolve GETs served (file path, Range header), optionally for one file only."""
        with self.lock:
            out = [
                (u.split("/resolve/", 1)[1].split("/", 1)[1], r)
                for m, u, r in self.log
                if m == "GET" and "/resolve/" in u
            ]
        return [item for item in out if path is None or item[0] == path]

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _etag(path: str, data: bytes) -> str:
    if path.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # a git blob id, like the Hub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.fake.lock:
            self.fake.log.append((self.command, path, self.headers.get("Range")))
        if path.startswith("/api/models/"):
            return self._api(path[len("/api/models/") :])
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            return self._resolve(repo_id, rest.split("/", 1)[1] if "/" in rest else "", head)
        self._send(404, b"not found", {"X-Error-Code": "RepoNotFound"})

    def _api(self, rest: str) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        if repo_id not in self.fake.repos:
            return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        files, sha = self.fake.repos[repo_id], self.fake.commits[repo_id]
        if not tail or tail[0] == "revision":
            body = {"id": repo_id, "sha": sha, "siblings": [{"rfilename": p} for p in files]}
        elif tail[0] == "tree":
            body = []
            for p, data in files.items():
                entry = {"type": "file", "path": p, "size": len(data), "oid": _etag(p + ".git", data)}
                if p.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": _etag(p, data), "size": len(data), "pointerSize": 134}
                body.append(entry)
        else:
            return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"})
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, file: str, head: bool) -> None:
        files = self.fake.repos.get(repo_id)
        if files is None:
            return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, head)
        sha = self.fake.commits[repo_id]
        if file not in files:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, head)
        data = files[file]
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{_etag(file, data)}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if file.endswith(LFS_SUFFIXES):
            headers["X-Linked-Size"] = str(len(data))
        if head:
            return self._send(200, data, headers, head=True)
        byte_range = None if self.fake.ignore_range else self.headers.get("Range")
        data = self.fake.corrupted.get((repo_id, file), data)
        if byte_range and not byte_range.endswith("-"):  # bytes=A-B: a header read, never a fault's
            first, last = (int(x) for x in byte_range.split("=", 1)[1].split("-", 1))
            last = min(last, len(data) - 1)
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            return self._send(206, data[first : last + 1], headers)
        with self.fake.lock:
            drop = file in self.fake.dropping
            self.fake.dropping.discard(file)
            stall = self.fake.stalling.pop(file, None)
        if not drop and stall is None and file in self.fake.failing:
            return self._send(500, b"server error", {"X-Repo-Commit": sha})
        start = 0
        if byte_range:
            start = int(byte_range.split("=", 1)[1].split("-", 1)[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if stall is not None:  # part of the body, then silence: the client is interrupted meanwhile
            self.send_response(206 if byte_range else 200)
            for key, value in {**headers, "Content-Length": str(len(data) - start)}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data[start : start + stall])
            self.wfile.flush()
            self.fake.released.wait(timeout=30)
            self.close_connection = True
            return
        if drop:  # announce the whole file, send half, hang up: a connection cut mid-download
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(206 if byte_range else 200, data[start:], headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


def point_at(server: "FakeHub", tmp_path: Path, monkeypatch) -> None:
    """Send huggingface_hub (and `models pull`) to `server`, with the HF cache and FlashDesk's
    config in tmp_path, no token, and no waits between retries."""
    from flashdesk.engine.hub import hub_download

    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hub_download, "RETRY_WAIT_S", 0.0)
