"""``swarmrl.rollouts``: the packing that the trainer's update and the validator's logprob re-check share, and a
package that loads its heavy libraries only for the half that is used."""

import subprocess
import sys
from pathlib import Path

import torch

from swarmrl.rollouts.packing import Sequence, pack

REPO = Path(__file__).resolve().parents[1]


def test_pack_right_pads_and_places_completion_logprobs_where_their_tokens_are_predicted():
    seqs = [Sequence([1, 2, 3], [4, 5], [-0.5, -0.25], 1.0, 1.0), Sequence([6], [7, 8, 9], [-1.0, -2.0, -3.0], 0.0, 1.0)]
    p = pack(seqs, pad_id=0)
    assert p["ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert p["attn"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # logits at position j predict token j+1: a completion token at position k is scored at k - 1
    assert p["cmask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert p["old"].tolist() == [[0, 0, -0.5, -0.25], [-1.0, -2.0, -3.0, 0]]
    assert p["ids"].dtype == p["attn"].dtype == torch.long and p["old"].dtype == p["cmask"].dtype == torch.float32


def test_the_package_and_the_wire_format_import_no_torch():
    code = ("import sys, swarmrl.rollouts; assert not {'torch', 'pyarrow'} & set(sys.modules), 'package'; "
            "import swarmrl.rollouts.wire; assert 'pyarrow' in sys.modules and 'torch' not in sys.modules, 'wire'; "
            "from swarmrl.rollouts import pack; assert 'torch' in sys.modules, 'packing'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_chunked_logprobs_equal_the_full_log_softmax(tiny_model_dir, monkeypatch):
    """The chunked path (LM head over completion positions only, CHUNK_TOKENS at a time, recomputed in backward)
    gives the full log-softmax's logprobs and entropies, and the same gradients, within float32 rounding."""
    import random

    import torch

    import swarmrl.rollouts.packing as packing
    from swarmrl.models.io import load_model

    model = load_model(tiny_model_dir).train()
    rng = random.Random(0)
    seqs = []
    for _ in range(6):
        comp = [rng.randrange(4, 200) for _ in range(rng.randint(1, 7))]
        seqs.append(packing.Sequence([rng.randrange(4, 200) for _ in range(rng.randint(1, 9))], comp,
                                     [-1.0] * len(comp), 1.0, 1.0))
    packed = packing.pack(seqs, 0)
    monkeypatch.setattr(packing, "CHUNK_TOKENS", 5)  # several chunks, the last one short
    assert packing._plain_head(model) is not None
    a, ea = packing.sequence_logprobs(model, packed, 0.7, with_entropy=True, entropy_grad=True)
    b, eb = packing._full_logprobs(model, packed, 0.7, True)
    m = packed["cmask"]
    assert float(((a - b) * m).abs().max()) <= 1e-6 and float(((ea - eb) * m).abs().max()) <= 5e-6
    params = list(model.parameters())
    ga = torch.autograd.grad(((a + ea) * m).sum(), params, allow_unused=True)
    gb = torch.autograd.grad(((b + eb) * m).sum(), params, allow_unused=True)
    assert max(float((x - y).abs().max()) for x, y in zip(ga, gb) if x is not None) <= 1e-5
    model.config.final_logit_softcapping = 30.0  # a head that is not plain logits: the full path
    assert packing._plain_head(model) is None
