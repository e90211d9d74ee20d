"""Swarm mode of the async RL loop: untrusted nodes behind the protocol orchestrator.

- ``policy``: where nodes get policy weights (``PolicySource``; the run dir now, SHARDCAST later)
- ``node``: the node process (register, heartbeat, generate assigned rollouts, upload signed) and
  its adversarial variants
- ``adapter``: the trainer side (advance the orchestrator's step, fetch accepted files into the run dir)
- ``launcher``: ``swarmrl run --swarm`` (orchestrator, validator, trainer + adapter, N nodes)
"""
