"""Swarm mode of the async RL loop: untrusted nodes behind the protocol orchestrator.

- ``policy``: where nodes get policy weights (``PolicySource``: SHARDCAST servers announced in heartbeats,
  fixed SHARDCAST servers, or the run dir)
- ``node``: the node process (register, heartbeat, generate assigned rollouts, upload signed) and
  its adversarial variants
- ``adapter``: the trainer side (advance the orchestrator's step, announce weight servers, fetch accepted
  files into the run dir)
- ``launcher``: ``swarmrl run`` in swarm mode (orchestrator, validator, trainer + adapter + relays, N nodes)
"""
