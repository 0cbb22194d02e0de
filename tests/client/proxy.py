"""A TCP proxy the test can cut: every open connection through it is closed at once.

It stands for what drops long-lived HTTP connections in production (a load
balancer's idle timeout, a network blip) between the client and a healthy API.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class CuttableProxy:
    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Close every connection now open, both sides; new ones still pass."""
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            for close in (lambda s: s.shutdown(socket.SHUT_RDWR), socket.socket.close):
                try:
                    close(sock)
                except OSError:
                    pass

    def __enter__(self) -> CuttableProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.close()
        self.cut()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._open += [client, upstream]
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
