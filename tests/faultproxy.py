"""Network faults in front of a real server, for tests: a loopback TCP proxy that loses or
spoils the reply to chosen requests, and a server that accepts requests and never answers.

The proxy passes bytes through unchanged, except for the reply to the next request whose head
(request line and headers) matches a rule: that reply is awaited -- so the server has acted
on the request -- and then either dropped (the client's connection is closed: a lost reply)
or replaced by a bare ``503``. Clients send a request only once the previous reply on the
same connection has arrived, so "the next reply" on that connection is the request's.

Usage::

    proxy = FaultProxy(server.ports["s3"])
    env = {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
    proxy.spoil(rb"^PUT [^ ]*/lease\\.json", "drop")   # the next matching reply is lost
    ...
    proxy.close()
"""

from __future__ import annotations

import re
import socket
import threading

_REQUEST = re.compile(rb"^(GET|PUT|POST|DELETE|HEAD) ")
_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def _hang_up(sock: socket.socket) -> None:
    """Close ``sock`` so that its peer sees it at once: ``close()`` alone sends nothing while
    another thread is still blocked reading the socket."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port``.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>`` to give clients.
        requests: the request lines seen, in order.
        spoiled: how many replies were dropped or replaced.
        bytes_to_client: reply bytes relayed to clients in all.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self._listen = _listener()
        self.endpoint = f"http://127.0.0.1:{self._listen.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.spoiled = 0
        self.bytes_to_client = 0
        self._rules: list[list] = []  # [pattern, how, times left]
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def spoil(self, pattern: bytes, how: str = "drop", times: int = 1) -> None:
        """Drop (``"drop"``) or turn into 503 (``"503"``) the reply to the next ``times``
        requests whose head matches ``pattern`` (a regex, case-insensitive)."""
        assert how in ("drop", "503"), how
        with self._lock:
            self._rules.append([re.compile(pattern, re.I | re.S), how, times])

    def close(self) -> None:
        self._closed = True
        for sock in [self._listen, *self._sockets]:
            _hang_up(sock)

    def _match(self, head: bytes) -> str | None:
        with self._lock:
            self.requests.append(head.split(b"\r\n", 1)[0])
            for rule in self._rules:
                if rule[2] > 0 and rule[0].search(head):
                    rule[2] -= 1
                    return rule[1]
        return None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listen.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:
            client.close()
            return
        self._sockets += [client, server]
        pending: list[str] = []  # what to do with the next reply on this connection

        def upstream() -> None:
            try:
                while data := client.recv(65536):
                    if _REQUEST.match(data):
                        how = self._match(data.split(b"\r\n\r\n", 1)[0])
                        if how:
                            pending.append(how)
                    server.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    server.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        threading.Thread(target=upstream, daemon=True).start()
        try:
            while data := server.recv(65536):
                # "100 Continue" is an interim reply: the real one follows
                if pending and data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 100"):
                    how = pending.pop(0)
                    with self._lock:
                        self.spoiled += 1
                    if how == "503":
                        client.sendall(_503)
                    return
                client.sendall(data)
                with self._lock:
                    self.bytes_to_client += len(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                _hang_up(sock)


class SilentServer:
    """Accepts connections and reads requests on 127.0.0.1 but never answers (a hung gateway,
    a stopped process whose socket is still open). ``requests`` counts request lines received."""

    def __init__(self) -> None:
        self._listen = _listener()
        self.endpoint = f"http://127.0.0.1:{self._listen.getsockname()[1]}"
        self.requests = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listen.accept()
            except OSError:
                return
            self._sockets.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                with self._lock:
                    self.requests += len(re.findall(rb"(?:^|\r\n)(?:GET|PUT|POST|DELETE|HEAD) /", data))
        except OSError:
            pass

    def close(self) -> None:
        for sock in [self._listen, *self._sockets]:
            _hang_up(sock)
