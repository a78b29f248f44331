"""A TCP relay on 127.0.0.1 that delays every byte by a fixed time in each direction (a slow link in
miniature: 50 ms each way is a 100 ms round trip). Bounded: it serves at most `lifetime` seconds, then closes
its listener and every connection by itself; `stop()` ends it sooner.

It also counts round trips: `turns()` is how many times, since `mark()`, a client sent data after data had come
from the server (the client waited for an answer before it could go on: each such turn costs a round trip on a
slow link). The same count for gpunode and for `ssh node SCRIPT` compares them."""

from __future__ import annotations

import heapq
import select
import socket
import threading
import time


class _Pair:
    """The two sockets of one relayed connection, closed when both directions have ended."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.socks, self.left, self.lock = (a, b), 2, threading.Lock()

    def one_done(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.close()

    def close(self) -> None:
        for sock in self.socks:
            try:
                sock.close()
            except OSError:
                pass


class DelayRelay:
    def __init__(self, target_port: int, delay: float = 0.05, lifetime: float = 900.0) -> None:
        self.target_port, self.delay = target_port, delay
        self.deadline = time.monotonic() + lifetime
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._events: list[bool] = []  # per chunk received, in order: True from the client, False from the server
        self._events_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True, name="relay-accept")
        self._accept.start()

    def _done(self) -> bool:
        return self._stop.is_set() or time.monotonic() > self.deadline

    def _serve(self) -> None:
        try:
            while not self._done():
                ready, _, _ = select.select([self.listener], [], [], 0.2)
                if not ready:
                    continue
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                for sock in (client, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pair = _Pair(client, upstream)
                for src, dst in ((client, upstream), (upstream, client)):
                    thread = threading.Thread(target=self._pump, args=(src, dst, pair, src is client), daemon=True,
                                              name="relay-pump")
                    thread.start()
                    self._threads.append(thread)
        finally:
            self.listener.close()

    def mark(self) -> None:
        """Start counting turns afresh."""
        with self._events_lock:
            self._events.clear()

    def turns(self) -> int:
        """Client sends that followed data from the server, since `mark()` (the first send counts as one)."""
        with self._events_lock:
            events = list(self._events)
        count, last = 0, False
        for from_client in events:
            if from_client and (count == 0 or not last):
                count += 1
            last = from_client
        return count

    def _pump(self, src: socket.socket, dst: socket.socket, pair: _Pair, from_client: bool) -> None:
        """Read from src, hold each chunk `delay` seconds, then write it to dst (order kept)."""
        queue: list[tuple[float, int, bytes]] = []
        seq = 0
        eof = False
        try:
            while not self._done():
                now = time.monotonic()
                while queue and queue[0][0] <= now:
                    dst.sendall(heapq.heappop(queue)[2])
                if eof and not queue:
                    dst.shutdown(socket.SHUT_WR)
                    return
                wait = max(0.0, queue[0][0] - now) if queue else 0.2
                if eof:
                    time.sleep(wait)
                    continue
                ready, _, _ = select.select([src], [], [], min(wait, 0.2))
                if ready:
                    data = src.recv(262144)
                    if not data:
                        eof = True
                    else:
                        with self._events_lock:
                            self._events.append(from_client)
                        heapq.heappush(queue, (time.monotonic() + self.delay, seq, data))
                        seq += 1
        except OSError:
            pair.close()  # a reset in one direction ends the connection
        finally:
            pair.one_done()

    def stop(self) -> None:
        self._stop.set()
        self._accept.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> DelayRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
