"""The action-protocol server answers without transport stalls."""

from __future__ import annotations

import socket
import threading
from http.server import ThreadingHTTPServer

import httpx

from actions.runtime.server import ActionRuntime, make_handler


def test_replies_go_out_with_nagle_disabled():
    """A reply is two small writes (headers, body); with Nagle's algorithm the body waits for
    the client's delayed ACK (~40 ms a call on loopback), so every accepted connection must
    have TCP_NODELAY set."""
    handler = make_handler(ActionRuntime())
    seen: list[int] = []

    class Recording(handler):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            super().setup()
            seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with httpx.Client() as client:
            assert client.get(f"http://127.0.0.1:{port}/").json()["ok"] is True
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(flag != 0 for flag in seen), seen
