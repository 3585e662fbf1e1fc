"""The servers' inputs stated exactly: host names as a browser sends them, --listen,
the password file and its Basic credentials, the TLS pair and the token file."""

from __future__ import annotations

import base64
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from gpustation.errors import UsageError
from gpustation.serve import http, webguard
from gpustation.serve.exporter import parse_listen
from gpustation.serve.web import read_token_file


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        (" LocalHost. ", "localhost"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "0x7f.1"),  # not all digits: a name, not an address
        ("2130706433", "127.0.0.1"),
        ("999.1.1.1", "999.1.1.1"),  # digits, but no address: kept as it came
        ("[::1]", "[::1]"),
        ("[0:0::1]", "[::1]"),
        ("fe80::1%eth0", "[fe80::1]"),
        ("10.0.0.1", "10.0.0.1"),
    ],
)
def test_host_names_are_compared_in_one_form(given: str, canonical: str) -> None:
    assert webguard.canonical_host(given) == canonical


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("box:8765", "box"),
        ("BOX", "box"),
        ("[::1]:8765", "[::1]"),
        ("[::1]", "[::1]"),
        ("[::1", None),
        ("box:port", None),
        ("box:", None),
        ("[::1]x", None),
        (":8765", None),
        ("", None),
    ],
)
def test_a_host_header_s_name(header: str, name: str | None) -> None:
    assert webguard.host_name(header) == name


def test_the_names_a_server_answers_to() -> None:
    loop = webguard.listen_names("127.0.0.1", ("Box.Example.",))
    assert loop == webguard.LOOPBACK_NAMES | {"127.0.0.1", "box.example"}
    assert webguard.listen_names("::1") == webguard.LOOPBACK_NAMES | {"[::1]"}
    assert webguard._is_loopback("[::1]") and webguard._is_loopback("127.0.0.2")
    assert not webguard._is_loopback("10.0.0.1") and not webguard._is_loopback("box")
    one = webguard.listen_names("10.1.2.3")
    assert "10.1.2.3" in one and "[::1]" not in one and "127.0.0.1" not in one
    assert all(n for n in one)
    assert webguard.same_origin(" HTTP://Box:80 ", "http", "box:80")
    assert not webguard.same_origin("http://box:81", "http", "box:80")


def test_session_keys_are_new_each_time_and_only_those_issued_are_valid() -> None:
    keys = webguard.SessionKeys()
    a, b = keys.issue(), keys.issue()
    assert a != b and len(a) >= 32
    assert keys.valid(a) and keys.valid(b)
    assert not keys.valid(None) and not keys.valid("") and not keys.valid(a + "x")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        (" :9400 ", ("0.0.0.0", 9400)),
        ("[::1]:1", ("::1", 1)),
        ("box:65535", ("box", 65535)),
    ],
)
def test_listen_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("9400", "--listen: expected HOST:PORT (e.g. 127.0.0.1:9400), got '9400'"),
        ("[nope]:1", "--listen: 'nope' is not an IPv6 address"),
        ("::1:9400", "--listen: put an IPv6 address in brackets, e.g. [::1]:9400, got '::1:9400'"),
        ("box:0", "--listen: port must be 1-65535, got '0'"),
        ("box:65536", "--listen: port must be 1-65535, got '65536'"),
        ("box:x", "--listen: port must be 1-65535, got 'x'"),
    ],
)
def test_listen_addresses_refused(text: str, says: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_listen(text)
    assert str(err.value) == says


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_the_password_file(tmp_path: Path) -> None:
    users = _private(tmp_path / "users", "# who\n\nalice:s3cret:with:colons\n bob:pw \n")
    assert http.load_users(users) == {"alice": "s3cret:with:colons", "bob": "pw"}
    for text, says in (
        ("alice\n", "line 1: expected user:password"),
        ("# c\n:pw\n", "line 2: expected user:password"),
        ("alice:\n", "line 1: expected user:password"),
        ("# nobody\n", "names no user"),
    ):
        path = _private(tmp_path / "bad", text)
        with pytest.raises(UsageError) as err:
            http.load_users(path)
        assert str(err.value).startswith("--basic-auth-file: ") and str(err.value).endswith(says)
        assert str(path) in str(err.value)


def _basic(user_password: str) -> str:
    return "Basic " + base64.b64encode(user_password.encode()).decode()


def test_basic_credentials() -> None:
    users = {"alice": "pw", "bob": "other"}
    assert http._authorized(_basic("alice:pw"), users)
    assert http._authorized(_basic("alice:pw").replace("Basic", "BASIC"), users)
    assert not http._authorized(_basic("alice:wrong"), users)
    assert not http._authorized(_basic("carol:pw"), users)
    assert not http._authorized(_basic("carol:\0pw"), users)  # no user has that password
    assert not http._authorized("Bearer " + _basic("alice:pw")[6:], users)
    assert not http._authorized("Basic !!!", users)
    assert not http._authorized("Basic " + base64.b64encode(b"\xff:\xfe").decode(), users)


def test_a_tls_pair_that_does_not_fit_is_named(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    context = http.tls_context(cert, key)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(UsageError) as err:
        http.tls_context(cert, cert)
    assert str(err.value).startswith(f"--tls-cert/--tls-key: cannot use {cert} with {cert}: ")
    with pytest.raises(UsageError, match="--tls-key"):
        http.tls_context(cert, tmp_path / "none.pem")


def test_a_token_file_holds_one_long_printable_token(tmp_path: Path) -> None:
    assert read_token_file(_private(tmp_path / "t", "  " + "a" * 16 + "\n")) == "a" * 16
    for text in ("a" * 15, "a" * 10 + " " + "a" * 10, "a" * 16 + "\x01"):
        with pytest.raises(UsageError) as err:
            read_token_file(_private(tmp_path / "t", text))
        assert str(err.value).startswith(
            f"--token-file: {tmp_path / 't'} must hold one token of 16"
        )


def test_a_secret_file_others_can_read_is_refused_naming_its_option(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("alice:pw\n")
    users.chmod(0o644)
    with pytest.raises(UsageError) as err:
        http.load_users(users)
    assert str(err.value) == (
        f"--basic-auth-file: {users} can be read by other users; make it private with "
        f"`chmod 600 {users}`"
    )
    token = tmp_path / "token"
    token.write_text("a" * 20)
    token.chmod(0o644)
    with pytest.raises(UsageError) as err:
        read_token_file(token)
    assert str(err.value).startswith(f"--token-file: {token} can be read by other users")
    missing = tmp_path / "none"
    with pytest.raises(UsageError) as err:
        read_token_file(missing)
    assert str(err.value).startswith(f"cannot read --token-file {missing}: ")
    short = _private(tmp_path / "short", "a" * 15)
    with pytest.raises(UsageError) as err:
        read_token_file(short)
    assert str(err.value).endswith(
        "e.g. from `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    )


def test_each_half_of_the_tls_pair_is_named_when_it_cannot_be_read(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    with pytest.raises(UsageError) as err:
        http.tls_context(cert, key)
    assert str(err.value).startswith(f"cannot read --tls-cert {cert}: ")
    cert.write_text("not a certificate")
    with pytest.raises(UsageError) as err:
        http.tls_context(cert, key)
    assert str(err.value).startswith(f"cannot read --tls-key {key}: ")


def test_a_password_may_hold_colons_and_credentials_must_be_plain_base64() -> None:
    users = {"alice": "s3:cret"}
    assert http._authorized(_basic("alice:s3:cret"), users)
    assert not http._authorized(_basic("alice:s3:cret") + "!!", users)
    assert not http._authorized("Basic !" + _basic("alice:s3:cret")[6:], users)


def test_an_unauthorized_scrape_and_the_favicon_are_answered_in_words() -> None:
    status, headers, body = http.metrics_response(None, {"alice": "pw"}, "/metrics", {})  # type: ignore[arg-type]
    assert (status, body) == (401, b"unauthorized\n")
    assert headers == [
        ("Content-Type", "text/plain"),
        ("WWW-Authenticate", 'Basic realm="gpustation"'),
    ]
    for path in ("/favicon.ico", "/favicon.ico?size=32"):
        answer = http.metrics_response(None, None, path, {})  # type: ignore[arg-type]
        assert answer == (404, [("Content-Type", "text/plain")], b"not found\n")


def test_a_host_name_half_in_brackets_is_kept_as_it_came() -> None:
    assert webguard.canonical_host("[::1") == "[::1"
    assert webguard.canonical_host("::1]") == "::1]"
    assert webguard.host_name("box:5") == "box"


def test_localhost_and_the_wildcards_answer_to_their_own_names() -> None:
    assert webguard.listen_names("localhost") == webguard.LOOPBACK_NAMES
    mac = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
    for wildcard in ("0.0.0.0", "::"):
        names = webguard.listen_names(wildcard)
        assert names >= webguard.LOOPBACK_NAMES
        assert not any(mac.match(n) for n in names)  # interface addresses, not hardware ones
    v6 = webguard.listen_names("::")
    assert "127.0.0.1" in v6 and "[::]" in v6


def test_a_scope_is_dropped_from_an_ipv6_address_however_many_percent_signs() -> None:
    assert webguard.canonical_host("fe80::1%eth0%x") == "[fe80::1]"
    assert webguard.host_name("[::1]]:80") is None  # the first "]" ends the address


def test_a_wildcard_answers_to_every_address_of_this_machine_s_interfaces() -> None:
    names = webguard.listen_names("0.0.0.0")
    addresses = {
        webguard.canonical_host(a.address)
        for found in psutil.net_if_addrs().values()
        for a in found
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }
    if not addresses - webguard.LOOPBACK_NAMES:
        pytest.skip("no address here beyond loopback")
    assert addresses <= names


def test_a_session_key_is_good_for_its_lifetime_and_not_a_moment_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])  # the clock the keys are read by
    keys = webguard.SessionKeys(lifetime_s=10.0)
    key = keys.issue()
    now[0] = 109.999
    assert keys.valid(key)
    now[0] = 110.0
    assert not keys.valid(key)
