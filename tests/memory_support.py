"""What a test process holds in tensors, wherever they are referenced."""

from __future__ import annotations

import gc

import torch
from torch.distributed.tensor import DTensor


def live_tensor_bytes() -> int:
    """Every tensor this process holds, wherever it is referenced: the bytes of each distinct storage of every live
    tensor, a sharded tensor by its local shard (a DTensor is a wrapper: its local shard is a tensor of its own,
    found here too), a tensor in an opaque layout (oneDNN's) by its elements."""
    gc.collect()
    storages: dict[int, int] = {}
    for o in gc.get_objects():
        if not isinstance(o, torch.Tensor) or isinstance(o, DTensor) or o.device.type == "meta":
            continue
        try:
            s = o.untyped_storage()
        except (RuntimeError, NotImplementedError):
            storages[id(o)] = o.numel() * o.element_size()
            continue
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())
