"""Handing freed heap memory back to the system, and measuring a process's own peak (``peak_rss_mb``).

glibc keeps what ``free`` returns inside its heap for reuse; after a training step has freed its activations and
gradients, hundreds of MB sit there, resident but unused, and the next step's allocations do not always fit into
the holes. ``release_freed_memory`` asks glibc (``malloc_trim``) to give back every free page, so a process's
resident size follows what it holds. Elsewhere (another libc, another OS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource


@functools.cache
def _trim():  # noqa: ANN202
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system; whether this platform could (glibc)."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_before_embedding_backward(model) -> object | None:  # noqa: ANN001
    """Hand the heap's free pages back when the backward pass reaches ``model``'s input embeddings: by then every
    layer's activations are freed, and what comes next (the embedding's gradient, the size of the vocabulary times
    the width, and its sum with a tied LM head's) would otherwise be counted on top of them. Returns the forward
    hook's handle (None for a model without ``get_input_embeddings``)."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if get is not None else None
    if emb is None:
        return None

    def on_grad(grad):  # noqa: ANN001, ANN202
        release_freed_memory()
        return grad

    def on_forward(module, args, out):  # noqa: ANN001, ANN202
        if getattr(out, "requires_grad", False):
            out.register_hook(on_grad)

    return emb.register_forward_hook(on_forward)


def peak_rss_mb() -> float:
    """This process's peak resident size in MB since it started its program: ``VmHWM`` from ``/proc/self/status``.
    ``getrusage``'s ``ru_maxrss`` is not that: Linux carries it across ``execve``, so a process started by a large
    parent (fork, then exec) reports at least the parent's size at the fork. Elsewhere, ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
