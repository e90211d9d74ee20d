"""2 data-parallel ranks (gloo on 127.0.0.1) must produce the same update as 1 rank on the same batch."""

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from swarmrl.models import load_model
from swarmrl.rl.config import LossConfig
from swarmrl.rl.train_step import Passes, WholeBatch, accumulate_gradients
from swarmrl.rollouts.packing import Sequence
from swarmrl.training.parallel import allreduce_grads
from swarmrl.utils.procs import free_port


def _batch(n=6):
    rng = random.Random(0)
    seqs = []
    for _ in range(n):
        p = [rng.randrange(4, 200) for _ in range(rng.randint(3, 6))]
        c = [rng.randrange(4, 200) for _ in range(rng.randint(1, 5))]
        seqs.append(Sequence(p, c, [-rng.random() * 3 for _ in c], rng.uniform(-1.5, 1.5), 1.0))
    return seqs


def _step(model, seqs, rank, world, norm):
    # SGD: the update is the (clipped) gradient itself, so any difference in the summed gradient shows;
    # Adam's first step is ~sign(grad) and would amplify float noise on near-zero gradients.
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    mine = seqs[rank::world]
    accumulate_gradients(model, mine, LossConfig(normalization=norm), 0,
                         WholeBatch(5, len(seqs), sum(len(s.completion_ids) for s in seqs)), Passes(2))
    if world > 1:
        allreduce_grads(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grads = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return {**{k: v.detach().clone() for k, v in model.state_dict().items()}, **grads}


def _rank_main(rank, world, port, model_dir, out_dir, norm):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = load_model(model_dir)
        model.train()
        torch.save(_step(model, _batch(), rank, world, norm), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("norm", ["token", "sequence"])
def test_two_ranks_equal_one_rank(tiny_model_dir, tmp_path, norm):
    model = load_model(tiny_model_dir)
    model.train()
    single = _step(model, _batch(), 0, 1, norm)
    mp.start_processes(_rank_main, args=(2, free_port(), str(tiny_model_dir), str(tmp_path), norm), nprocs=2,
                       start_method="spawn")
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    before = load_model(tiny_model_dir).state_dict()
    changed = 0
    for k in single:
        torch.testing.assert_close(r0[k], r1[k], rtol=0, atol=0)  # ranks stay identical
        torch.testing.assert_close(r0[k], single[k], rtol=1e-5, atol=1e-6)
        if k in before:
            changed += int(not torch.equal(single[k], before[k]))
    assert changed > 0  # the update did something
