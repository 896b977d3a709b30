"""A timed bulk TCP transfer between two processes: the rate a shaped class delivers.

Run inside the namespace (``ip netns exec NS python bench/lab/ratecheck.py``). This
process listens on ``--address`` (as a TF task listens on its own 127.0.0.K, so that the
data leaves from it, through that address's class), a second process connects, and this
one sends ``--mbytes`` through the socket; the receiver times from the first byte to the
last. Prints one JSON line: bytes, seconds, Mbit/s.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

CHUNK = 1 << 20


def receive(host: str, port: int, total: int) -> None:
    """Connect, read `total` bytes, print the timing as JSON."""
    with socket.create_connection((host, port)) as conn:
        got = first = len(conn.recv(CHUNK))
        start = time.perf_counter()
        while got < total:
            data = conn.recv(CHUNK)
            if not data:
                raise SystemExit(f"connection closed after {got} of {total} bytes")
            got += len(data)
        seconds = time.perf_counter() - start
        conn.sendall(b"k")  # the sender waits for this: no byte left in flight
    timed = total - first
    print(json.dumps({"bytes": timed, "seconds": seconds, "mbit_s": timed * 8 / seconds / 1e6}))


def send(address: str, total: int, timeout: float) -> dict:
    """Listen on `address`, start the receiver, send `total` bytes; its JSON."""
    with socket.socket() as server:
        server.bind((address, 0))
        server.listen(1)
        port = server.getsockname()[1]
        receiver = subprocess.Popen(
            [sys.executable, __file__, "--receive", address, str(port), str(total)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            server.settimeout(timeout)
            conn, _ = server.accept()
            with conn:
                payload = b"\0" * CHUNK
                left = total
                while left > 0:
                    left -= conn.send(payload[: min(left, CHUNK)])
                conn.settimeout(timeout)
                conn.recv(1)
            out, _ = receiver.communicate(timeout=timeout)
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--receive"]:
        receive(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--mbytes", type=float, default=50.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    print(json.dumps(send(args.address, int(args.mbytes * 1e6), args.timeout)))


if __name__ == "__main__":
    main()
