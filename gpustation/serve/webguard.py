"""Who may use the web view: the names it answers to, the pages that may drive it, its sessions.

* ``Host`` must be one of the names the server listens as (only loopback
  names on loopback), so that a page on another name that resolves here (DNS
  rebinding) is refused before anything is served;
* ``Origin``, where the browser sends one (always on a websocket), must be the
  address the request went to, so that a page served from another port of
  this host cannot drive the dashboard with this server's cookie;
* the token opens a session: the cookie holds a random key of that session,
  never the token, because browsers send a host's cookies to every port of
  it and the token outlives the server (a ``--token-file`` is reused).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
import socket
import time
from collections import OrderedDict

#: the names every loopback address is reached by
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: how long a connection may stay without a request before it is closed
IDLE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
#: dashboards at once: each is a process of its own
MAX_SESSIONS = 4
#: how long a session's cookie opens the dashboard after the token was given
SESSION_LIFETIME_S = 12 * 3600.0
#: session keys kept; the oldest is forgotten first
MAX_SESSION_KEYS = 64

_IPV4_NUMBERS = re.compile(r"\d+(\.\d+){0,3}")


def canonical_host(name: str) -> str:
    """``name`` lowercased without a trailing dot; an IPv4 shorthand (``127.1``) as a dotted quad.

    IPv6 addresses come in brackets, as in a URL.
    """
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if _IPV4_NUMBERS.fullmatch(name):
        try:
            return socket.inet_ntoa(socket.inet_aton(name))
        except OSError:
            return name
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return name
    return f"[{address}]" if address.version == 6 else str(address)


def listen_names(host: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The ``Host`` names a server listening on ``host`` answers to.

    Loopback: the loopback names. A wildcard (``0.0.0.0``, ``::``): those, this
    machine's names and every address of its interfaces. Any other address:
    it and this machine's names. ``extra`` (``--server-name``) is added as given.
    """
    host = canonical_host(host)
    names = {host, *(canonical_host(n) for n in extra)}
    if host in LOOPBACK_NAMES or _is_loopback(host):
        return frozenset(names | LOOPBACK_NAMES)
    names |= {canonical_host(socket.gethostname()), canonical_host(socket.getfqdn())}
    if host in ("0.0.0.0", "[::]"):
        # start-up time: psutil, only when processes are inspected
        import psutil

        names |= LOOPBACK_NAMES
        for addresses in psutil.net_if_addrs().values():
            for a in addresses:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(canonical_host(a.address))
    return frozenset(n for n in names if n)


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``); None if malformed."""
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        name, rest = header[: end + 1], header[end + 1 :]
    else:
        name, colon, port = header.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return canonical_host(name) if name else None


def same_origin(origin: str, scheme: str, host_header: str) -> bool:
    """True when the page that sent ``Origin`` is the address the request went to."""
    return origin.strip().lower() == f"{scheme}://{host_header}".lower()


class SessionKeys:
    """The keys the token opened, each good for :data:`SESSION_LIFETIME_S`."""

    def __init__(self, lifetime_s: float = SESSION_LIFETIME_S, keep: int = MAX_SESSION_KEYS):
        self.lifetime_s = lifetime_s
        self.keep = keep
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def issue(self) -> str:
        key = secrets.token_urlsafe(32)
        self._expiry[key] = time.monotonic() + self.lifetime_s
        while len(self._expiry) > self.keep:
            self._expiry.popitem(last=False)
        return key

    def valid(self, given: str | None) -> bool:
        if not given:
            return False
        now = time.monotonic()
        for key, expiry in list(self._expiry.items()):
            if expiry <= now:
                del self._expiry[key]
        # compared one by one in constant time, so the answer's timing says nothing of a key
        found = False
        for key in self._expiry:
            found |= hmac.compare_digest(given.encode(), key.encode())
        return found
