"""The command line fails in one line: ``error: WHAT (WHAT TO DO)`` on stderr, no traceback (unless ``--debug``),
exit 2 for a usage error (the command line or what it names is wrong) and 1 when the command ran and its work
failed (swarmrl/cli/errors.py). Every option has help, and help text is printed as written (no rich markup)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from _shardcast_util import make_file
from typer.testing import CliRunner

from swarmrl.cli import app

REPO = Path(__file__).resolve().parents[1]


def cli(*argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    env.pop("SWARMRL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "swarmrl", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(r: subprocess.CompletedProcess, code: int) -> str:
    """The single line on stderr of a command that failed with ``code``."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def _commands(cmd, path):  # noqa: ANN001, ANN202
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_every_option_of_every_command_has_help():
    missing = [f"{' '.join(path)} {'/'.join(p.opts)}" for path, cmd in _commands(typer.main.get_command(app), ["swarmrl"])
               for p in cmd.params if not (getattr(p, "help", None) or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_help_text_is_printed_as_written():
    r = CliRunner().invoke(app, ["toploc", "prove", "--help"])
    assert r.exit_code == 0
    assert "[positions, hidden]" in " ".join(r.output.split())


def test_usage_errors_are_one_line_with_exit_2(tmp_path):
    line = one_error_line(cli("shardcast", "publish", "x.bin", "--version", "v1", cwd=tmp_path), 2)
    assert line.startswith("error: ") and "'--version'" in line and "shardcast publish --help" in line
    line = one_error_line(cli("nosuch", cwd=tmp_path), 2)
    assert "No such command 'nosuch'" in line


def test_publish_of_a_missing_file(tmp_path):
    line = one_error_line(cli("shardcast", "publish", "missing.safetensors", "--dir", "od", cwd=tmp_path), 2)
    assert line == ("error: checkpoint file not found: missing.safetensors (give the path of an existing file to "
                    "publish)")
    assert not (tmp_path / "od").exists() or not any((tmp_path / "od").iterdir())


def test_fetch_version_must_be_a_number(tmp_path):
    line = one_error_line(cli("shardcast", "fetch", "--server", "http://127.0.0.1:9", "--out", "x", "--origin-pubkey",
                              "ab" * 32, "--version", "v1", cwd=tmp_path), 2)
    assert "--version 'v1'" in line and "version number" in line


def test_malformed_public_keys(tmp_path):
    line = one_error_line(cli("shardcast", "fetch", "--server", "http://127.0.0.1:9", "--out", "x", "--origin-pubkey",
                              "not-a-key", cwd=tmp_path), 2)
    assert "'not-a-key'" in line and "--origin-pubkey" in line
    line = one_error_line(cli("shardcast", "relay", "--upstream", "http://127.0.0.1:9", "--dir", "r", "--port", "0",
                              "--origin-pubkey", "zz", cwd=tmp_path), 2)
    assert "'zz'" in line and "64-hex-char" in line
    key = tmp_path / "authority.pem"
    assert cli("node", "keygen", "--out", str(key), cwd=tmp_path).returncode == 0
    line = one_error_line(cli("orchestrator", "deposit", "--key", str(key), "--amount", "1", "--public-key", "zz",
                              "--orchestrator", "http://127.0.0.1:9", cwd=tmp_path), 2)
    assert "--public-key 'zz' is not a valid public key" in line


def test_busy_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        want = f"error: port {port} on 127.0.0.1 is in use"
        line = one_error_line(cli("orchestrator", "serve", "--port", str(port), "--data-dir", "o", cwd=tmp_path), 2)
        assert line.startswith(want) and "--port" in line
        line = one_error_line(cli("shardcast", "origin", "--dir", "od", "--port", str(port), cwd=tmp_path), 2)
        assert line.startswith(want)


def test_fetch_with_the_wrong_key_says_the_manifest_did_not_verify(tmp_path):
    from swarmrl.shardcast import Origin
    from swarmrl.shardcast.signing import keygen

    keygen(tmp_path / "origin.key")
    other = keygen(tmp_path / "other.key")
    o = Origin(tmp_path / "od", key=tmp_path / "origin.key")
    o.publish_sync(make_file(tmp_path / "m.bin", 100_000), 3)
    url = o.serve()
    try:
        r = cli("shardcast", "fetch", "--server", url, "--origin-pubkey", other, "--out", "got.bin", cwd=tmp_path)
    finally:
        o.close()
    line = one_error_line(r, 1)  # a failed fetch, not a usage error: the server could be the one lying
    assert line.startswith("fetch failed: the manifest signature of v3 did not verify with the given origin public key")
    assert url in line and "no server offers" not in line


def test_an_unexpected_error_is_one_line_unless_debug(monkeypatch):
    import swarmrl.envs

    def boom():  # noqa: ANN202
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(swarmrl.envs, "available_envs", boom)
    r = CliRunner().invoke(app, ["tasks"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr.strip() == ("error: RuntimeError: boom; second line (run `swarmrl --debug ...` to see the "
                                "traceback)")
    r = CliRunner().invoke(app, ["--debug", "tasks"])
    assert isinstance(r.exception, RuntimeError)


@pytest.mark.parametrize("argv", [["run", "--steps", "x"], ["eval", "--n", "-"], ["rl", "worker", "--id", "a b"]])
def test_more_usage_errors(argv):
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r.output


def test_an_unreachable_server_is_one_line(tmp_path):
    line = one_error_line(cli("node", "status", "--orchestrator", "http://127.0.0.1:9", "--node-id", "abc",
                              cwd=tmp_path), 1)
    assert line.startswith("error: cannot reach http://127.0.0.1:9/") and "Connection refused" in line
