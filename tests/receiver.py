"""A loopback HTTP endpoint that keeps every JSON message POSTed to it: what
apprise's ``json://127.0.0.1:PORT`` delivers, for the notification tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.messages.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()
                receiver.got.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
