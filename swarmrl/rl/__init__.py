"""Asynchronous GRPO: the trainer (built from ``swarmrl.training``) and its parts, the loss registry (``losses``),
one update (``train_step``), LoRA policies, and the local worker process (sampling through ``swarmrl.generation``)."""
