"""A small PEP 503/691 package index on 127.0.0.1 for tests: real HTTP, real wheel files.

``LocalIndex(root)`` builds wheels (zip files with a ``.dist-info/METADATA``) and serves
``/simple/<project>/`` as JSON (``Accept: application/vnd.pypi.simple.v1+json``) or HTML, the
files themselves with HTTP range requests, and ``<file>.metadata`` (PEP 658) for the files
published with ``pep658=True``. It counts the bytes it sent, so tests can show that a big wheel's
METADATA is read without downloading the wheel.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def metadata_text(name: str, version: str, requires_dist=(), requires_python: str | None = None,
                  extras=()) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires_dist]
    return "\n".join(lines) + "\n\n"


def _do_head(handler) -> None:
    """HEAD of a wheel file: its size and that it serves byte ranges (as GET does)."""
    m = re.fullmatch(r"/files/([^/]+)", handler.path)
    path = handler.files_dir / m.group(1) if m else None
    if path is None or not path.is_file():
        handler.send_response(404)
        handler.end_headers()
        return
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Content-Length", str(path.stat().st_size))
    handler.send_header("Accept-Ranges", "bytes")
    handler.end_headers()


class LocalIndex:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.files_dir = self.root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.projects: dict[str, list[dict]] = {}
        self.bytes_sent = 0
        self.requests: list[str] = []
        self.authorizations: set[str] = set()  # Authorization headers seen: proof a credential arrived
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ content
    def add_wheel(self, name: str, version: str, tag: str = "py3-none-any", *, requires_dist=(),
                  requires_python=None, extras=(), pep658: bool = False, padding: int = 0, files=()) -> Path:
        dist = re.sub(r"[-_.]+", "_", name)
        filename = f"{dist}-{version}-{tag}.whl"
        path = self.files_dir / filename
        meta = metadata_text(name, version, requires_dist, requires_python, extras)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{dist}/__init__.py", "")
            for member in files:   # e.g. bitsandbytes/libbitsandbytes_cuda118.so: names a test reads back
                z.writestr(member, b"\x7fELF")
            if padding:   # incompressible bytes, stored: a wheel too big to read whole
                z.writestr(zipfile.ZipInfo(f"{dist}/blob.bin"), os.urandom(padding), compress_type=zipfile.ZIP_STORED)
            z.writestr(f"{dist}-{version}.dist-info/METADATA", meta, compress_type=zipfile.ZIP_DEFLATED)
            z.writestr(f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\n")
            # RECORD, which uv requires of a wheel (pip tolerates its absence)
            z.writestr(f"{dist}-{version}.dist-info/RECORD", "".join(f"{n},,\n" for n in z.namelist())
                       + f"{dist}-{version}.dist-info/RECORD,,\n")
        if pep658:
            (self.files_dir / (filename + ".metadata")).write_text(meta)
        self._add(name, filename, requires_python, pep658)
        return path

    def add_sdist(self, name: str, version: str, requires_python=None) -> None:
        filename = f"{re.sub(r'[-_.]+', '_', name)}-{version}.tar.gz"
        (self.files_dir / filename).write_bytes(b"not a real sdist")
        self._add(name, filename, requires_python, False)

    def _add(self, name, filename, requires_python, pep658):
        norm = re.sub(r"[-_.]+", "-", name).lower()
        data = (self.files_dir / filename).read_bytes()
        entry = {"filename": filename, "url": f"../../files/{filename}",
                 "hashes": {"sha256": hashlib.sha256(data).hexdigest()}, "size": len(data),
                 "requires-python": requires_python}
        if pep658:
            meta = (self.files_dir / (filename + ".metadata")).read_bytes()
            entry["core-metadata"] = {"sha256": hashlib.sha256(meta).hexdigest()}
        self.projects.setdefault(norm, []).append(entry)

    # ------------------------------------------------------------------ server
    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    def __enter__(self) -> LocalIndex:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code, body: bytes, ctype: str, extra=None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)
                index.bytes_sent += len(body)

            def do_GET(self):  # noqa: N802 (http.server API)
                index.requests.append(self.path)
                if self.headers.get("Authorization"):
                    index.authorizations.add(self.headers["Authorization"])
                m = re.fullmatch(r"/simple/([^/]+)/", self.path)
                if m:
                    files = index.projects.get(m.group(1))
                    if files is None:
                        return self._send(404, b"no such project", "text/plain")
                    if "application/vnd.pypi.simple.v1+json" in (self.headers.get("Accept") or ""):
                        body = json.dumps({"meta": {"api-version": "1.1"}, "name": m.group(1), "files": files}).encode()
                        return self._send(200, body, "application/vnd.pypi.simple.v1+json")
                    links = []
                    for f in files:
                        attrs = f'href="{html.escape(f["url"])}#sha256={f["hashes"]["sha256"]}"'
                        if f.get("requires-python"):
                            attrs += f' data-requires-python="{html.escape(f["requires-python"])}"'
                        if f.get("core-metadata"):
                            attrs += f' data-core-metadata="sha256={f["core-metadata"]["sha256"]}"'
                        links.append(f"<a {attrs}>{html.escape(f['filename'])}</a><br/>")
                    body = ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()
                    return self._send(200, body, "text/html")
                m = re.fullmatch(r"/files/([^/]+)", self.path)
                if not m or not (index.files_dir / m.group(1)).is_file():
                    return self._send(404, b"not found", "text/plain")
                data = (index.files_dir / m.group(1)).read_bytes()
                rng = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range") or "")
                if not rng:
                    return self._send(200, data, "application/octet-stream", {"Accept-Ranges": "bytes"})
                a, b = rng.groups()
                if a == "":
                    start, end = max(0, len(data) - int(b)), len(data) - 1
                else:
                    start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
                return self._send(206, data[start:end + 1], "application/octet-stream",
                                  {"Content-Range": f"bytes {start}-{end}/{len(data)}", "Accept-Ranges": "bytes"})

        Handler.files_dir = index.files_dir
        Handler.do_HEAD = _do_head  # uv asks whether a wheel serves ranges before reading its METADATA
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
