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
