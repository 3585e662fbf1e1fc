"""The dashboard in a browser: textual-serve behind a token.

textual-serve starts one dashboard process per browser connection (the
``command`` :func:`dashboard_command` builds, read-only unless control was
allowed) and carries its terminal over a websocket to xterm.js. This module
adds what a dashboard of someone's machine needs before it is put on a port:

* every request needs the token: ``?token=`` on the first page, then a cookie
  (HttpOnly, SameSite=Strict) that the page's own requests carry; anything
  else gets 403, the websocket that drives the dashboard included;
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

from gpustation.errors import GpustationError, UsageError
from gpustation.files import read_text
from gpustation.pyargv import python_argv

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


class DashboardServer(Server):
    """textual-serve's server with a token on every request.

    ``token`` None serves without one (the command allows that on loopback,
    read-only, only).
    """

    def __init__(self, command: str, host: str, port: int, token: str | None, title: str) -> None:
        super().__init__(command, host=host, port=port, title=title)
        self.token = token
        # Cookies are per host, not per port: one server's must not shadow another's.
        self.cookie = f"gpustation_web_{port}"

    # -- the token -------------------------------------------------------------------
    def _matches(self, given: str | None) -> bool:
        assert self.token is not None
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    @web.middleware
    async def check_token(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """403 unless the request carries the token (in ``?token=`` or the cookie)."""
        if self.token is None:
            return await handler(request)
        from_query = self._matches(request.query.get("token"))
        if not from_query and not self._matches(request.cookies.get(self.cookie)):
            raise web.HTTPForbidden(
                text="gpustation web: this address needs its token; open the URL "
                "gpustation web printed when it started (…/?token=…)\n"
            )
        response = await handler(request)
        if from_query and not response.prepared:
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        return response

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

    def make_app(self) -> web.Application:
        """textual-serve's routes and templates, every one behind :meth:`check_token`."""
        app = web.Application(middlewares=[self.check_token])
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
    server: DashboardServer, on_ready: Callable[[int], None], shutdown_s: float = 5.0
) -> None:
    """Listen until SIGTERM (or Ctrl-C, which reaches the caller as KeyboardInterrupt).

    ``on_ready`` gets the bound port once connections are accepted.
    """
    runner = web.AppRunner(server.make_app(), shutdown_timeout=shutdown_s)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        site = web.TCPSite(runner, server.host, server.port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            raise GpustationError(
                f"cannot listen on {url_host(server.host)}:{server.port}: {err.strerror or err}"
            ) from None
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        sockets = [s for s in (runner.addresses or []) if isinstance(s, tuple)]
        on_ready(int(sockets[0][1]) if sockets else server.port)
        await stop.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        # Open sessions are told to quit; each dashboard process then ends.
        await runner.cleanup()
