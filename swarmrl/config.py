"""One config system for every command: pydantic models, TOML files, CLI overrides.

A command owns a pydantic model (``extra="forbid"`` so typos fail loudly). ``load_config`` reads
an optional TOML file, applies ``key.sub=value`` overrides (values parsed as TOML literals when
they parse, else taken as strings) and validates. Every failure raises ``ConfigError`` whose
message names the offending field.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ConfigError", "StrictModel", "load_config", "parse_override", "dump_config", "read_toml_keys", "refuse_moved"]


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, assignment is validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


T = TypeVar("T", bound=BaseModel)


def refuse_moved(data: Any, moved: dict[str, str], where: str, example: str) -> Any:
    """A model's ``mode="before"`` check: ``data`` (a section's raw keys) naming a key that ``moved`` to another
    place is refused with where each went (``where``: the new home, ``example``: a line that sets one there)."""
    if isinstance(data, dict):
        old = [k for k in moved if k in data]
        if old:
            raise ValueError(f"moved into {where}: " + ", ".join(f"{k} -> {moved[k]}" for k in old)
                             + f" (e.g. {example})")
    return data


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value`` into (["a", "b", "c"], value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. rl.lr=1e-4)")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(p.isidentifier() for p in path):
        raise ConfigError(f"override {item!r}: {key!r} is not a dotted field name")
    return path, _parse_value(raw.strip())


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {'.'.join(path[: i + 1])} is not a section")
        node = child
    node[path[-1]] = value


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"  {field}: {msg}")
    return "\n".join(lines)


def load_config(model: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None, base_source: str = "") -> T:
    """Build ``model`` from an optional TOML file plus ``key=value`` overrides. ``base`` (no file then): the data
    to start from instead, e.g. what a command takes from a run config; ``base_source`` names it in errors."""
    if base is not None and path is not None:
        raise ValueError("load_config takes a file or a base, not both")
    data: dict[str, Any] = copy.deepcopy(base) if base is not None else {}
    source = base_source or "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from e
        source = str(p)
    for item in overrides or []:
        key_path, value = parse_override(item)
        _set_path(data, key_path, value)
    if overrides:
        source += " + overrides"
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_error(e, source)) from None


def read_toml_keys(path: str | Path) -> set[str]:
    """The top-level keys of the TOML file ``path`` (none if it is missing or not TOML: ``load_config`` says so)."""
    try:
        return set(tomllib.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return set()


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as TOML text (round-trips through ``load_config``)."""
    return _to_toml(json.loads(cfg.model_dump_json()))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _to_toml(data: dict[str, Any], prefix: str = "") -> str:
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict) and v is not None]
    tables = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    out: list[str] = []
    if prefix and (scalars or not tables):
        out.append(f"[{prefix}]")
    out += [f"{k} = {_toml_value(v)}" for k, v in scalars]
    for k, v in tables:
        sub = _to_toml(v, f"{prefix}.{k}" if prefix else k)
        if sub:
            out.append("")
            out.append(sub)
    return "\n".join(out)
