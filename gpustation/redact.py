"""Secrets taken out of what gpustation writes down or prints.

A notification URL carries its service's credentials (``mailto://user:pass@``,
``ntfy://...?token=``, a webhook's token in its path) and a run's ``--env``
values may be API keys. Whatever is logged, stored in a run directory or
shown keeps the shape of such a URL (scheme, user, host) with the secret
parts replaced by :data:`REDACTED`, so a message still says which URL is
meant; a run keeps its variables' names, never their values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "***"

# query keys and config keys that name a secret
_SECRET_NAME = re.compile(
    r"pass|pwd|secret|token|key|auth|cred|sig|session|cookie|bearer|webhook", re.IGNORECASE
)
# settings whose value is a secret (narrower: [keys] holds key bindings)
_SECRET_SETTING = re.compile(r"pass(word|wd)?$|secret|token|api_?key", re.IGNORECASE)
# a path segment or query value that reads like a generated token: long, and
# letters mixed with digits (a topic such as "my-gpus" stays readable)
_TOKENISH = re.compile(r"(?=[^/]*[A-Za-z])(?=[^/]*\d)[A-Za-z0-9_\-.~+=%]{16,}")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
_SPLIT = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#]*)([^?#]*)(\?[^#]*)?(#.*)?$", re.DOTALL)


def redact_url(url: str) -> str:
    """``url`` with its userinfo password, a non-numeric "port" (a bot token),
    token-like path segments and secret query values replaced by ``***``."""
    m = _SPLIT.match(url)
    if m is None:
        return url
    scheme, netloc, path, query, fragment = m.groups()
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + REDACTED
        elif _TOKENISH.fullmatch(userinfo):
            userinfo = REDACTED
        netloc = f"{userinfo}@{_host(host)}"
    else:
        netloc = _host(netloc)
    path = "/".join(REDACTED if _TOKENISH.fullmatch(s) else s for s in path.split("/"))
    if query:
        pairs = []
        for pair in query[1:].split("&"):
            key, sep, value = pair.partition("=")
            if sep and value and (_SECRET_NAME.search(key) or _TOKENISH.fullmatch(value)):
                value = REDACTED
            pairs.append(f"{key}{sep}{value}")
        query = "?" + "&".join(pairs)
    return f"{scheme}{netloc}{path}{query or ''}{'#' + REDACTED if fragment else ''}"


def _host(host: str) -> str:
    name, sep, port = host.rpartition(":")
    if sep and port and not port.isdigit() and not host.endswith("]"):
        return f"{name}:{REDACTED}"
    return host


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`)."""
    return _URL.sub(lambda m: redact_url(m.group()), text) if "://" in text else text


def has_secret(url: str) -> bool:
    """Whether ``url`` carries something :func:`redact_url` hides."""
    return redact_url(url) != url


def secret_name(name: str) -> bool:
    """Whether a setting's name says its value is a secret (``password``,
    ``api_token``); one naming a file that holds it (``*_file``) is not."""
    return bool(_SECRET_SETTING.search(name)) and not name.lower().endswith(("_file", "_path"))


def redact_words(text: str) -> str:
    """A command line or log line with its secrets hidden: URLs' credentials,
    ``NAME=VALUE`` and ``--name VALUE`` where the name says secret (``--api-key``,
    ``HF_TOKEN=``), and long token-like words."""
    words = redact_text(text).split(" ")
    out: list[str] = []
    hide_next = False
    for word in words:
        name, eq, _ = word.partition("=")
        if hide_next and word:
            out.append(REDACTED)
            hide_next = False
            continue
        if eq and secret_name(name.lstrip("-")):
            out.append(f"{name}={REDACTED}")
        elif word.startswith("-") and secret_name(word.lstrip("-").replace("-", "_")):
            out.append(word)
            hide_next = True
        elif _TOKENISH.fullmatch(word):
            out.append(REDACTED)
        else:
            out.append(word)
    return " ".join(out)


def redact_env(env: Mapping[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """``env`` with every value but those of ``keep`` replaced by ``***``."""
    kept = set(keep)
    return {k: v if k in kept else REDACTED for k, v in env.items()}
