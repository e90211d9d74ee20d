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
