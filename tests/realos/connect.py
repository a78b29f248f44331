"""QEMU's guestfwd `cmd:` end: relays one guest TCP connection (stdin/stdout) to 127.0.0.1:PORT.

    python3 connect.py PORT
"""

import os
import socket
import sys
import threading


def main() -> None:
    out = sys.stdout.buffer
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))

    def up() -> None:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    while True:
        data = sock.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()


if __name__ == "__main__":
    main()
