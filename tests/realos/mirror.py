"""The guest's only window on the network: an HTTP server on 127.0.0.1 that QEMU's slirp `guestfwd` connects
the guest's http://10.0.2.100/ to.

/debian/... and /debian-security/... are relayed to Debian's archive (and nothing else: any other path is 404),
with the immutable pool/ files kept under the cache so a second run downloads them once; /local/... serves the
test's own apt repository (a directory).
"""

from __future__ import annotations

import shutil
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ARCHIVE = "http://deb.debian.org"
RELAYED = ("/debian/", "/debian-security/")


class MirrorServer:
    def __init__(self, local_repo: Path, cache: Path) -> None:
        self.local_repo = local_repo
        self.cache = cache
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                pass

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = self.path.split("?", 1)[0]
                server.requests.append(path)
                if ".." in path.split("/"):
                    return self._status(400)
                if path.startswith("/local/"):
                    target = server.local_repo / path[len("/local/"):]
                    return self._file(target, head) if target.is_file() else self._status(404)
                if not path.startswith(RELAYED):
                    return self._status(404)
                cached = server.cache / path.lstrip("/") if "/pool/" in path else None
                if cached is not None and cached.is_file():
                    return self._file(cached, head)
                try:
                    with urllib.request.urlopen(ARCHIVE + path, timeout=120) as upstream:  # noqa: S310
                        data = upstream.read()
                except urllib.error.HTTPError as exc:
                    return self._status(exc.code)
                except OSError:
                    return self._status(502)
                if cached is not None:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    part = cached.with_suffix(cached.suffix + ".part")
                    part.write_bytes(data)
                    part.replace(cached)
                self._bytes(data, head)

            def _status(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _bytes(self, data: bytes, head: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def _file(self, target: Path, head: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(target.stat().st_size))
                self.end_headers()
                if not head:
                    with target.open("rb") as f:
                        shutil.copyfileobj(f, self.wfile)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="realos-mirror", daemon=True)

    def start(self) -> MirrorServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
