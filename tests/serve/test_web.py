"""``gpustation web``: its options, the token on every request, what it says on start."""

from __future__ import annotations

import shlex
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpustation import cli
from gpustation.errors import EXIT_FAILURE, EXIT_USAGE
from gpustation.serve.web import dashboard_command, new_token

from .webserver import WebServer

pytestmark = pytest.mark.timeout(180)


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of a GET, a refusal included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def private_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


# ---- refused before anything is served ------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--listen", "nowhere"], "--listen: expected HOST:PORT"),
        (["--listen", "127.0.0.1:70000"], "--listen: port must be 1-65535"),
        (["--allow-control", "--no-token"], "--allow-control needs a token"),
        (["--no-token", "--listen", "0.0.0.0:8765"], "--no-token only on a loopback address"),
        (["--refresh", "0.01"], "--refresh: between 0.25 and 10 seconds"),
        (["--gpus", "x"], "--gpus"),
        (["--max-sessions", "0"], "--max-sessions: between 1 and 64"),
        (["--max-connections", "5"], "--max-connections: between --max-sessions + 4 (8)"),
        (["--idle-timeout", "0"], "--idle-timeout: between 0.5 and 3600 seconds"),
        (["--idle-timeout", "nan"], "--idle-timeout: between 0.5 and 3600 seconds"),
        (["--server-name", "http://box:80"], "--server-name: a host name or address without"),
    ],
)
def test_bad_options_exit_2_saying_what_was_wrong(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["web", "--simulate", "2", *argv]) == EXIT_USAGE
    assert says in capsys.readouterr().err


def test_a_token_file_must_be_private_and_hold_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    shared.write_text(new_token())
    shared.chmod(0o644)
    assert cli.main(["web", "--token-file", str(shared)]) == EXIT_USAGE
    assert f"chmod 600 {shared}" in capsys.readouterr().err

    short = private_file(tmp_path / "short", "abc\n")
    assert cli.main(["web", "--token-file", str(short)]) == EXIT_USAGE
    assert "16 or more characters" in capsys.readouterr().err

    assert cli.main(["web", "--token-file", str(tmp_path / "absent")]) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err

    good = private_file(tmp_path / "good", new_token())
    assert cli.main(["web", "--no-token", "--token-file", str(good)]) == EXIT_USAGE
    assert "--no-token and --token-file" in capsys.readouterr().err


def test_a_port_in_use_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["web", "--simulate", "2", "--listen", f"127.0.0.1:{port}"])
    assert code == EXIT_FAILURE
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


def test_the_served_command_is_this_dashboard_read_only_unless_control_is_allowed() -> None:
    options = ["--simulate", "2", "--gpus", "0,1"]
    python = "/opt/my python/bin/python3"  # a space must survive the shell
    served = shlex.split(dashboard_command(options, read_only=True, python=python))
    assert served == [python, "-P", "-m", "gpustation", "--read-only", *options]
    allowed = shlex.split(dashboard_command(options, read_only=False, python=python))
    assert allowed == [python, "-P", "-m", "gpustation", *options]
    assert cli.build_parser().parse_args(served[4:]).read_only


# ---- the real command, over loopback ----------------------------------------------------


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def fetch_once(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of a GET whose redirect is not followed."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=30) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def session_cookie(web: WebServer) -> str:
    """The cookie the server sets for the printed URL, as ``name=value``."""
    status, _, headers = fetch_once(web.url())
    assert status == 303
    return headers["Set-Cookie"].split(";", 1)[0]


ROUTES = ("/", "/ws", "/static/js/textual.js", "/download/anything")


def test_the_token_is_swapped_for_a_session_cookie_that_is_not_it() -> None:
    with WebServer("--simulate", "2") as web:
        web.wait_listening()
        token = web.token()
        assert len(token) >= 40
        port = web.port
        hint = web.wait_line(r"listening on loopback only").string
        assert f"ssh -L {port}:127.0.0.1:{port} " in hint
        assert "(read-only)" in web.wait_line(r"the dashboard at").string

        for path in (*ROUTES, "/?token=wrong"):
            status, body, _ = fetch(web.base + path)
            assert status == 403, path
            assert "needs its token" in body or path == "/ws"
        # The token itself, as the old cookie held it, opens nothing.
        assert fetch(web.base + "/", {"Cookie": f"gpustation_web_{port}={token}"})[0] == 403

        status, _, headers = fetch_once(f"{web.base}/?fontsize=20&token={token}")
        assert status == 303
        assert headers["Location"] == "/?fontsize=20"  # the token leaves the address bar
        cookie = headers["Set-Cookie"]
        name, _, rest = cookie.partition("=")
        value = rest.split(";", 1)[0]
        assert name == f"gpustation_web_{port}"
        assert value and value != token and token not in cookie
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        assert headers["Cache-Control"] == "no-store"
        # Each use of the token opens a session of its own.
        assert session_cookie(web) != f"{name}={value}"

        with_cookie = {"Cookie": f"{name}={value}"}
        status, page, _ = fetch(web.base + "/", with_cookie)
        assert status == 200
        # The page's own requests go to the address the browser used.
        assert f'data-session-websocket-url="ws://127.0.0.1:{port}/ws"' in page
        assert f"http://127.0.0.1:{port}/static/js/textual.js" in page
        status, script, _ = fetch(web.base + "/static/js/textual.js", with_cookie)
        assert status == 200 and "WebSocket" in script
        status, page, _ = fetch(web.base + "/", {**with_cookie, "Host": f"localhost:{port}"})
        assert status == 200
        assert f'data-session-websocket-url="ws://localhost:{port}/ws"' in page
        assert fetch(web.base + "/", {"Cookie": f"{name}=x{value}"})[0] == 403
        assert web.stop() == 0  # SIGTERM ends it cleanly


def raw_get(port: int, head: bytes) -> bytes:
    """The status line of the answer to a hand-written request."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        return s.makefile("rb").readline()


@pytest.mark.parametrize("no_token", [False, True], ids=["token", "no-token"])
def test_a_host_this_server_is_not_is_refused_on_every_route(no_token: bool) -> None:
    with WebServer("--simulate", "2", *(["--no-token"] if no_token else [])) as web:
        web.wait_listening()
        port = web.port
        cookie = {} if no_token else {"Cookie": session_cookie(web)}
        assert fetch(web.base + "/", cookie)[0] == 200
        token = "" if no_token else web.token()
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            for path in (*ROUTES, f"/?token={token}"):
                status, body, _ = fetch(web.base + path, {**cookie, "Host": host})
                assert status == 421, (host, path)
                assert "does not answer to" in body
        # The loopback names, IPv4's shorthand among them, are this server.
        for host in (f"localhost:{port}", f"127.1:{port}", f"LOCALHOST.:{port}"):
            assert fetch(web.base + "/", {**cookie, "Host": host})[0] == 200, host
        # No Host at all (HTTP/1.0) is not a name this server answers to either.
        assert b" 421 " in raw_get(port, b"GET / HTTP/1.0\r\n\r\n")


@pytest.mark.parametrize("no_token", [False, True], ids=["token", "no-token"])
def test_the_websocket_opens_only_for_the_servers_own_page(no_token: bool) -> None:
    from tests.serve.webserver import free_port

    with WebServer("--simulate", "2", *(["--no-token"] if no_token else [])) as web:
        web.wait_listening()
        cookie = {} if no_token else {"Cookie": session_cookie(web)}
        upgrade = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            **cookie,
        }
        for origin in (f"http://127.0.0.1:{free_port()}", "http://evil.example", "null", None):
            headers = {**upgrade, **({"Origin": origin} if origin else {})}
            status, body, _ = fetch(web.base + "/ws", headers)
            assert status == 403, origin
            assert "only its own page may open the dashboard" in body
        # Any other request from a foreign page is refused the same way.
        foreign = {**cookie, "Origin": f"http://127.0.0.1:{free_port()}"}
        assert fetch(web.base + "/", foreign)[0] == 403
        assert fetch(web.base + "/", {**cookie, "Origin": web.base})[0] == 200
        # Through ssh -L on another local port, the page is at that port, and its own.
        tunnel = {**cookie, "Host": "127.0.0.1:9000", "Origin": "http://127.0.0.1:9000"}
        status, page, _ = fetch(web.base + "/", tunnel)
        assert status == 200 and 'data-session-websocket-url="ws://127.0.0.1:9000/ws"' in page


def test_no_token_on_127_1_is_loopback() -> None:
    with WebServer("--simulate", "2", "--no-token", host="127.1") as web:
        web.wait_listening()
        assert web.url() == f"http://127.0.0.1:{web.port}/"
        assert fetch(web.url())[0] == 200


def test_a_token_file_and_a_network_address_with_control_say_what_is_exposed(
    tmp_path: Path,
) -> None:
    token = new_token()
    token_file = private_file(tmp_path / "token", token + "\n")
    with WebServer(
        "--simulate", "2", "--allow-control", "--token-file", str(token_file), host="0.0.0.0"
    ) as web:
        web.wait_listening()
        assert web.token() == token
        assert "(control allowed)" in web.wait_line(r"the dashboard at").string
        warning = web.wait_line(r"warning: listening on 0\.0\.0\.0:").string
        assert "not a loopback address" in warning and "has the token" in warning
        assert "change it" in warning and "plain HTTP" in warning
        assert fetch(web.base + "/")[0] == 403
        cookie = {"Cookie": session_cookie(web)}
        assert fetch(web.base + "/", cookie)[0] == 200
        # On every address: this machine's name is accepted, another is not.
        here = {**cookie, "Host": f"{socket.gethostname()}:{web.port}"}
        assert fetch(web.base + "/", here)[0] == 200
        assert fetch(web.base + "/", {**cookie, "Host": f"evil.example:{web.port}"})[0] == 421


def test_web_is_in_the_command_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "the dashboard in a browser" in capsys.readouterr().out


def test_no_token_serves_loopback_without_one() -> None:
    with WebServer("--simulate", "2", "--no-token") as web:
        web.wait_listening()
        url = web.url()
        assert url == f"http://127.0.0.1:{web.port}/"
        status, page, headers = fetch(url)
        assert status == 200 and "Set-Cookie" not in headers
        assert f"ws://127.0.0.1:{web.port}/ws" in page


def test_ctrl_c_ends_it_with_130() -> None:
    import signal

    with WebServer("--simulate", "2") as web:
        web.wait_listening()
        web.url()
        web.proc.send_signal(signal.SIGINT)
        assert web.proc.wait(timeout=30) == 130
        web.wait_line(r"gpustation: interrupted")


# ---- the names and sessions, directly ----------------------------------------------------


def test_the_names_a_server_answers_to() -> None:
    from gpustation.serve.webguard import canonical_host, host_name, listen_names

    assert canonical_host("127.1") == canonical_host("2130706433") == "127.0.0.1"
    assert canonical_host("LocalHost.") == "localhost"
    assert canonical_host("::1") == canonical_host("[0:0::1]") == "[::1]"
    assert host_name("127.1:8765") == "127.0.0.1"
    assert host_name("[::1]:8765") == "[::1]" and host_name("box") == "box"
    for bad in ("", "box:http", "[::1", "::1:8765", "box:80:80"):
        assert host_name(bad) is None, bad

    here = canonical_host(socket.gethostname())
    loopback = listen_names("127.0.0.1")
    assert {"localhost", "127.0.0.1", "[::1]"} <= loopback
    assert here not in loopback or here == "localhost"
    assert listen_names("::1") == loopback
    assert "gpubox.example.org" in listen_names("127.0.0.1", ("GPUbox.example.org.",))
    everywhere = listen_names("0.0.0.0")
    assert here in everywhere and "127.0.0.1" in everywhere
    one = listen_names("192.0.2.7")
    assert "192.0.2.7" in one and here in one and "127.0.0.1" not in one


def test_a_session_key_expires_and_only_the_newest_are_kept() -> None:
    from gpustation.serve.webguard import SessionKeys

    keys = SessionKeys(keep=2)
    first, second, third = keys.issue(), keys.issue(), keys.issue()
    assert not keys.valid(first) and keys.valid(second) and keys.valid(third)
    assert not keys.valid(None) and not keys.valid("") and not keys.valid(third + "x")
    gone = SessionKeys(lifetime_s=0)
    assert not gone.valid(gone.issue())
