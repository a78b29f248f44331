"""A local HTTP server (127.0.0.1, an ephemeral port) with Range support and a few ways to misbehave, laid out
like NVIDIA's download site. Stopped by the fixture that starts it."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.ignore_range = False
        self.cut_after: int | None = None  # close the connection after this many body bytes (once)
        self.stall_after: int | None = None  # then send nothing for `stall_seconds` (once)
        self.stall_seconds = 0.0
        self.status: dict[str, int] = {}  # path -> an error status to answer with
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.requests.append((self.path, self.headers.get("Range")))
                if self.path in outer.status:
                    self.send_error(outer.status[self.path])
                    return
                data = outer.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and not outer.ignore_range:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.cut_after is not None:
                    cut, outer.cut_after = outer.cut_after, None
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if outer.stall_after is not None:
                    stall, outer.stall_after = outer.stall_after, None
                    self.wfile.write(body[:stall])
                    self.wfile.flush()
                    time.sleep(outer.stall_seconds)
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def publish(self, version: str, data: bytes, where: str = "tesla", sha256sum: str | None = None) -> None:
        path = (f"/tesla/{version}/NVIDIA-Linux-x86_64-{version}.run" if where == "tesla"
                else f"/XFree86/Linux-x86_64/{version}/NVIDIA-Linux-x86_64-{version}.run")
        self.files[path] = data
        if sha256sum is not None:
            self.files[f"/XFree86/Linux-x86_64/{version}/NVIDIA-Linux-x86_64-{version}.run.sha256sum"] = (
                f"{sha256sum}  NVIDIA-Linux-x86_64-{version}.run\n".encode())

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
