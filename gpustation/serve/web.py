"""The dashboard in a browser: textual-serve behind a token, its Origin and Host checked.

textual-serve starts one dashboard process per browser connection (the
``command`` :func:`dashboard_command` builds, read-only unless control was
allowed) and carries its terminal over a websocket to xterm.js. This module
adds what a dashboard of someone's machine needs before it is put on a port:

* every request's ``Host`` must be a name the server listens as (421 if not),
  and an ``Origin`` (a websocket always has one) must be the address the
  request went to (403 if not): see :mod:`gpustation.serve.webguard`;
* the token (``?token=``) is answered by a 303 to the same URL without it and
  a session cookie (HttpOnly, SameSite=Strict) that holds a key of its own,
  never the token; anything else gets 403, the websocket included;
* at most ``max_sessions`` dashboards at once (503 for the next), idle
  connections closed after ``idle_timeout_s``, at most ``max_connections``
  open (:mod:`gpustation.serve.listener`);
* the page's URLs are built from the address the browser used, so the
  dashboard works through ``ssh -L`` and on an address that is not the one
  listened on (``0.0.0.0``).

textual-serve itself imports neither textual nor gpustation's UI: the
dashboard runs in the child process, so this server stays headless.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp_jinja2
import jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

from gpustation.errors import UsageError
from gpustation.files import read_text
from gpustation.pyargv import python_argv
from gpustation.serve.listener import CappedListener, connection_cap, listen_sockets
from gpustation.serve.webguard import (
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_SESSIONS,
    SessionKeys,
    host_name,
    listen_names,
    same_origin,
)
from gpustation.textsafe import safe

#: the shortest token a --token-file may hold (token_urlsafe(32) makes 43 characters)
MIN_TOKEN_CHARS = 16


def new_token() -> str:
    return secrets.token_urlsafe(32)


def read_token_file(path: Path) -> str:
    """The token in ``path``: a file only its owner can read, one line, 16 characters or more."""
    token = read_text(path, "--token-file", private=True).strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise UsageError(
            f"--token-file: {path} must hold one token of {MIN_TOKEN_CHARS} or more "
            "characters without spaces, e.g. from "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return token


def dashboard_command(options: Sequence[str], read_only: bool, python: str = sys.executable) -> str:
    """The shell command textual-serve runs per connection: this dashboard, these options."""
    argv = python_argv(
        "-m", "gpustation", *(["--read-only"] if read_only else []), *options, python=python
    )
    return shlex.join(argv)


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: connections waiting in the kernel while the server is at its cap
BACKLOG = 64
#: descriptors one dashboard session holds in this server (its pipes, its process)
FDS_PER_SESSION = 8


class DashboardServer(Server):
    """textual-serve's server with a token on every request, its Host and Origin checked.

    ``token`` None serves without one (the command allows that on loopback,
    read-only, only). ``names`` are the ``Host`` names it answers to
    (:func:`~gpustation.serve.webguard.listen_names`).
    """

    def __init__(
        self,
        command: str,
        host: str,
        port: int,
        token: str | None,
        title: str,
        names: frozenset[str] | None = None,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        super().__init__(command, host=host, port=port, title=title)
        self.token = token
        self.names = names if names is not None else listen_names(host)
        self.max_sessions = max_sessions
        self.sessions = 0
        self.keys = SessionKeys()
        # Cookies are per host, not per port: one server's must not shadow another's.
        self.cookie = f"gpustation_web_{port}"

    # -- who is asking -----------------------------------------------------------------
    @web.middleware
    async def check_request(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """421 for a Host this server is not, 403 for a foreign Origin or a missing token."""
        host = request.headers.get("Host", "")
        if host_name(host) not in self.names:
            raise web.HTTPMisdirectedRequest(
                text=f"gpustation web: this server does not answer to {safe(host)!r}; open "
                "the address gpustation web printed when it started\n"
            )
        origin = request.headers.get("Origin")
        socket_route = request.match_info.route.name == "websocket"
        if (origin is not None or socket_route) and not same_origin(
            origin or "", request.scheme, host
        ):
            raise web.HTTPForbidden(
                text="gpustation web: only its own page may open the dashboard; "
                f"{safe(origin or 'a page without an Origin')!r} is another\n"
            )
        if self.token is None:
            return await handler(request)
        given = request.query.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise self._needs_token()
            # The token leaves the address bar and the history: a session key replaces it.
            query = [(k, v) for k, v in request.query.items() if k != "token"]
            response = web.HTTPSeeOther(request.rel_url.with_query(query))
            response.set_cookie(
                self.cookie,
                self.keys.issue(),
                max_age=int(self.keys.lifetime_s),
                httponly=True,
                samesite="Strict",
                path="/",
            )
            response.headers["Cache-Control"] = "no-store"
            raise response
        if not self.keys.valid(request.cookies.get(self.cookie)):
            raise self._needs_token()
        return await handler(request)

    @staticmethod
    def _needs_token() -> web.HTTPForbidden:
        return web.HTTPForbidden(
            text="gpustation web: this address needs its token; open the URL "
            "gpustation web printed when it started (…/?token=…)\n"
        )

    # -- the page ----------------------------------------------------------------------
    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        """The page, with its websocket and static URLs on the address the browser used."""
        origin = f"{request.scheme}://{request.host}"
        ws_scheme = "wss" if request.scheme == "https" else "ws"
        router = request.app.router
        static = str(router["static"].url_for(filename="/")).rstrip("/") + "/"
        context: dict[str, Any] = {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{ws_scheme}://{request.host}{router['websocket'].url_for()}",
            "config": {"static": {"url": origin + static}},
            "application": {"name": self.title},
        }
        return aiohttp_jinja2.render_template("app_index.html", request, context)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's dashboard session, refused (503) once ``max_sessions`` are open."""
        if self.sessions >= self.max_sessions:
            raise web.HTTPServiceUnavailable(
                text=f"gpustation web: {self.sessions} dashboards are open, the most "
                "--max-sessions allows; close one (its browser tab) and reload\n"
            )
        self.sessions += 1
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions -= 1

    def make_app(self) -> web.Application:
        """textual-serve's routes and templates, every one behind :meth:`check_request`."""
        app = web.Application(middlewares=[self.check_request])
        aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
        app.add_routes(
            [
                web.get("/", self.handle_index, name="index"),
                web.get("/ws", self.handle_websocket, name="websocket"),
                web.get("/download/{key}", self.handle_download, name="download"),
                web.static("/static", self.statics_path, name="static"),
            ]
        )
        return app


async def serve_until_stopped(
    server: DashboardServer,
    on_ready: Callable[[int], None],
    shutdown_s: float = 5.0,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Listen until SIGTERM (or Ctrl-C, which reaches the caller as KeyboardInterrupt).

    ``on_ready`` gets the bound port once connections are accepted. A
    connection that sends no request within ``idle_timeout_s`` (after it
    opened or after its last answer) is closed.
    """
    # aiohttp's keep-alive timer starts when a connection opens and is only
    # cancelled by a whole request, so it also ends one that sends nothing or a
    # request that never finishes.
    runner = web.AppRunner(
        server.make_app(), shutdown_timeout=shutdown_s, keepalive_timeout=idle_timeout_s
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    listener: CappedListener | None = None
    try:
        sockets = listen_sockets(server.host, server.port, BACKLOG)
        cap = connection_cap(max_connections, server.max_sessions * FDS_PER_SESSION)
        if cap < max_connections:
            print(
                f"gpustation: at most {cap} connections at once, not {max_connections}: "
                "the open-files limit leaves room for no more (`ulimit -n` raises it)",
                file=sys.stderr,
                flush=True,
            )
        assert runner.server is not None
        listener = CappedListener(sockets, runner.server, cap)
        listener.start()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        on_ready(listener.port)
        await stop.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if listener is not None:
            await listener.stop()
        # Open sessions are told to quit; each dashboard process then ends.
        await runner.cleanup()
