"""The pieces every training loop is built from, below the RL trainer, SFT and DiLoCo (each command assembles its
loop from these builders, in the spirit of torchtitan's trainer built from a spec of builders):

- ``model``: the model to train (``build_model``: a model directory's or a fresh tiny one), made ready to train
  (``prepare_model``: activation checkpointing, the memory hooks) and a frozen reference (``build_reference``);
- ``parallel``: how ranks hold the model (``build_parallel``: whole copies or FSDP2 shards) and the collectives they
  meet in (``init_distributed``, broadcast from rank 0, barrier, sum, the whole weights on rank 0);
- ``optim``: AdamW (``build_optimizer``: torch's fused kernel, or ``LowMemoryAdamW`` with bfloat16 moments and
  gradients) and ``clip_gradients``;
- ``schedule``: the one learning-rate rule (linear warm-up, optionally a cosine decay) as a scheduler
  (``build_scheduler``);
- ``checkpoint``: optimizer, schedule, RNG and counters saved and restored (``TrainerState``, ``Checkpointer``).

It knows nothing of RL, SFT or DiLoCo: it imports models, utils and rundir, never rl, sft, diloco or a server (``tests/test_architecture.py``). Importing the package loads nothing;
import the modules.
"""
