import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A fresh tiny Qwen2 model + byte tokenizer saved as an HF directory."""
    from swarmrl.models import ModelInitConfig, init_model

    d = tmp_path_factory.mktemp("tiny") / "model"
    init_model(ModelInitConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128), d)
    return d


@pytest.fixture()
def service(tmp_path):
    """``make(**config changes)``: an in-process ``Orchestrator`` (no HTTP) over a config of ``make_cfg``'s, closed
    at the end of the test."""
    made = []

    def make(**kw):  # noqa: ANN202  # (Orchestrator, OrchestratorConfig)
        from protocol_support import make_cfg

        from swarmrl.protocol.orchestrator import Orchestrator

        cfg, _ = make_cfg(tmp_path / f"o{len(made)}", **kw)
        made.append(Orchestrator(cfg))
        return made[-1], cfg

    yield make
    for o in made:
        o.db.dispose()
