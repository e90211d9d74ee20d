"""`swarmrl --help` and the commands that compute nothing must not import the heavy stacks.

Each case runs the CLI in a fresh interpreter (a module imported by an earlier test would hide a regression),
then lists which of the heavy top-level packages ended up in ``sys.modules``. No timing here: see
benchmarks/cli/bench.py for that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "aiohttp", "fastapi", "uvicorn", "sqlalchemy", "pyarrow", "matplotlib")

# Runs `swarmrl <argv>` in-process, then prints one JSON line: the exit code and the heavy modules loaded.
_WRAPPER = """
import json, sys
argv, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["swarmrl", *argv]
from swarmrl.cli import main
code = 0
try:
    main()
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
print("\\n@@" + json.dumps({"code": code, "offenders": sorted(m for m in heavy if m in sys.modules)}))
"""

GROUPS = ["model", "rl", "toploc", "shardcast", "node", "orchestrator", "validator"]
COMMANDS = ["run", "sft", "eval", "tasks", "plot", "filter", "diloco", "model init", "rl trainer", "rl worker",
            "rl adapter", "toploc calibrate", "toploc verify", "toploc prove", "toploc check", "shardcast keygen",
            "shardcast origin", "shardcast publish", "shardcast relay", "shardcast fetch", "node keygen",
            "node pubkey", "node run", "node status", "orchestrator serve", "validator run"]

CASES = (
    [[], ["--help"]]
    + [[g] for g in GROUPS]  # no_args_is_help: a bare group prints its help
    + [[g, "--help"] for g in GROUPS]
    + [c.split() + ["--help"] for c in COMMANDS]
    + [
        ["tasks"],
        ["run", "--print-config", "--config", "configs/run.toml"],
        ["rl", "trainer", "--print-config"],
        ["rl", "worker", "--id", "w0", "--print-config"],
        ["sft", "--print-config"],
        ["eval", "--print-config"],
        ["model", "init", "--out", "unused", "--print-config"],
        ["orchestrator", "serve", "--print-config", "--config", "configs/orchestrator.toml"],
        ["validator", "run", "--print-config", "--config", "configs/validator.toml"],
        ["node", "run", "--key", "k.pem", "--print-config"],
        ["node", "run", "--key", "k.pem", "--adversary", "forge_rewards", "--print-config"],
        ["diloco", "--print-config"],
        ["shardcast", "relay", "--print-config", "--config", "configs/shardcast_relay.toml"],
        ["shardcast", "fetch", "--server", "http://127.0.0.1:1", "--out", "x", "--origin-pubkey", "00",
         "--print-config"],
    ]
)


def run_cli(argv: list[str], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, json.dumps(argv), json.dumps(HEAVY)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"swarmrl {' '.join(argv)}: wrapper failed\n{proc.stdout}\n{proc.stderr}"
    line = proc.stdout.rsplit("\n@@", 1)[-1]
    return {**json.loads(line), "stdout": proc.stdout, "stderr": proc.stderr}


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a) or "(no args)")
def test_light_commands_import_nothing_heavy(argv: list[str], tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    argv = [str(repo / a) if a.startswith("configs/") else a for a in argv]
    res = run_cli(argv, tmp_path)
    ok = (0, 2) if argv == [] or (len(argv) == 1 and argv[0] in GROUPS) else (0,)  # no_args_is_help: status 2
    assert res["code"] in ok, f"swarmrl {' '.join(argv)} exited {res['code']}\n{res['stdout']}\n{res['stderr']}"
    assert res["offenders"] == [], f"swarmrl {' '.join(argv)} imported {res['offenders']}"


def test_key_commands_import_nothing_heavy(tmp_path: Path) -> None:
    for argv in (["node", "keygen", "--out", str(tmp_path / "node.pem")],
                 ["node", "pubkey", "--key", str(tmp_path / "node.pem")],
                 ["shardcast", "keygen", "--out", str(tmp_path / "origin.key")]):
        res = run_cli(argv, tmp_path)
        assert res["code"] == 0, f"swarmrl {' '.join(argv)} exited {res['code']}\n{res['stdout']}\n{res['stderr']}"
        assert res["offenders"] == [], f"swarmrl {' '.join(argv)} imported {res['offenders']}"
    assert (tmp_path / "node.pem").is_file() and (tmp_path / "origin.key.pub").is_file()


def test_print_config_still_prints_toml(tmp_path: Path) -> None:
    res = run_cli(["rl", "trainer", "--print-config", "--set", "steps=7"], tmp_path)
    assert res["code"] == 0 and res["offenders"] == []
    assert "steps = 7" in res["stdout"]


def test_fetch_loads_only_what_it_uses(tmp_path: Path) -> None:
    """`shardcast fetch`, piped (the benchmark's case): no rich (the result is one plain line), no other command's
    config models or server code, no key-file (PEM) support; the result line is whole, not wrapped."""
    from swarmrl.shardcast import Origin
    from swarmrl.shardcast.client.fetch import hash_file
    from swarmrl.shardcast.signing import keygen

    pub = keygen(tmp_path / "origin.key")
    src = tmp_path / "m.bin"
    src.write_bytes(bytes(range(256)) * 4000)
    o = Origin(tmp_path / "od", key=tmp_path / "origin.key")
    o.publish_sync(src, 4)
    url = o.serve()
    unused = ["rich", "swarmrl.shardcast.config", "swarmrl.utils.serving", "cryptography.hazmat.primitives.serialization",
              "swarmrl.shardcast.server.shard_server", "swarmrl.shardcast.server.relay", "swarmrl.shardcast.server.origin",
              # the other command modules: only the one naming the command line's first word is registered
              "swarmrl.cli.rl", "swarmrl.cli.toploc", "swarmrl.cli.protocol", "swarmrl.cli.diloco",
              "swarmrl.cli.models", "swarmrl.cli.train"]
    try:
        proc = subprocess.run([sys.executable, "-c", _WRAPPER, json.dumps(
            ["shardcast", "fetch", "--server", url, "--origin-pubkey", pub, "--out", "got.bin"]), json.dumps(unused)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        o.close()
    res = json.loads(proc.stdout.rsplit("\n@@", 1)[-1])
    assert res["code"] == 0, proc.stderr
    assert res["offenders"] == [], f"swarmrl shardcast fetch imported {res['offenders']}"
    assert (tmp_path / "got.bin").read_bytes() == src.read_bytes()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("v4 -> got.bin: 1,024,000 bytes, blake3 "), proc.stderr
    assert lines[0].split("blake3 ")[1].startswith(hash_file(tmp_path / "got.bin") + ", ")


def test_short_command_pauses_the_collector_and_skips_the_exit_collection_on_success(monkeypatch) -> None:
    import gc

    from swarmrl.cli import common, errors

    monkeypatch.setattr(errors, "_skip_exit_gc", False)
    seen = []

    @common.short_command
    def ok(x: int) -> int:
        seen.append(gc.isenabled())
        return x + 1

    @common.short_command
    def bad() -> None:
        seen.append(gc.isenabled())
        raise ValueError("no")

    assert gc.isenabled()
    with pytest.raises(ValueError):
        bad()
    assert gc.isenabled() and not errors.exit_gc_skipped()  # a failed command: the exit collects as usual
    assert ok(1) == 2
    assert seen == [False, False] and gc.isenabled() and errors.exit_gc_skipped()


def test_command_table_matches_what_each_module_registers() -> None:
    """`swarmrl.cli.COMMANDS` (first word -> module) must name exactly what each module's `register` adds, or a
    command would be missing when its module is the only one registered."""
    import importlib

    import typer

    from swarmrl.cli import COMMANDS

    for module in set(COMMANDS.values()):
        root = typer.Typer()
        importlib.import_module(f"swarmrl.cli.{module}").register(root)
        names = {g.name for g in root.registered_groups} | {c.name for c in root.registered_commands}
        assert names == {k for k, v in COMMANDS.items() if v == module}, module


def test_full_tree_and_one_module_tree_agree(tmp_path: Path) -> None:
    """`swarmrl --help` lists every command of the table; a command line naming one group registers that group
    only, and still runs (here: its help)."""
    from swarmrl.cli import COMMANDS

    res = run_cli(["--help"], tmp_path)
    assert res["code"] == 0
    listed = {line.split()[0] for line in res["stdout"].splitlines() if line.startswith("  ") and line.split()}
    assert set(COMMANDS) <= listed, set(COMMANDS) - listed
    modules = sorted(f"swarmrl.cli.{m}" for m in set(COMMANDS.values()))
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, json.dumps(["--debug", "toploc", "verify", "--help"]),
                           json.dumps(modules)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.rsplit("\n@@", 1)[-1])
    assert res["code"] == 0 and "Usage: swarmrl toploc verify" in proc.stdout
    assert res["offenders"] == ["swarmrl.cli.toploc"], res["offenders"]  # (the wrapper lists those it loaded)
