"""``gpustation web``: its options, the token on every request, what it says on start."""

from __future__ import annotations

import shlex
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


def test_every_request_needs_the_token_then_the_cookie_carries_it() -> None:
    with WebServer("--simulate", "2") as web:
        web.wait_listening()
        token = web.token()
        assert len(token) >= 40
        port = web.port
        hint = web.wait_line(r"listening on loopback only").string
        assert f"ssh -L {port}:127.0.0.1:{port} " in hint
        assert "(read-only)" in web.wait_line(r"the dashboard at").string

        for path in ("/", "/ws", "/static/js/textual.js", "/download/anything", "/?token=wrong"):
            status, body, _ = fetch(web.base + path)
            assert status == 403, path
            assert "needs its token" in body
        status, _, _ = fetch(web.base + "/", {"Cookie": f"gpustation_web_{port}=wrong"})
        assert status == 403

        status, page, headers = fetch(f"{web.base}/?token={token}")
        assert status == 200
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"gpustation_web_{port}={token};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        # The page's own requests go to the address the browser used.
        assert f'data-session-websocket-url="ws://127.0.0.1:{port}/ws"' in page
        assert f"http://127.0.0.1:{port}/static/js/textual.js" in page

        with_cookie = {"Cookie": f"gpustation_web_{port}={token}"}
        status, script, _ = fetch(web.base + "/static/js/textual.js", with_cookie)
        assert status == 200 and "WebSocket" in script
        status, page, _ = fetch(web.base + "/", {**with_cookie, "Host": f"localhost:{port}"})
        assert status == 200
        assert f'data-session-websocket-url="ws://localhost:{port}/ws"' in page
        assert web.stop() == 0  # SIGTERM ends it cleanly


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
        assert fetch(f"{web.base}/?token={token}")[0] == 200


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
