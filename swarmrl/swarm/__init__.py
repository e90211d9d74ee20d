"""Swarm mode of the async RL loop: untrusted nodes behind the protocol orchestrator.

- ``node``: the node process (register, heartbeat, generate assigned rollouts, upload signed)
- ``adapter``: the trainer side (advance the orchestrator's step, announce weight servers, fetch accepted
  files into the run dir)

``swarmrl run`` starts them through ``swarmrl.job``; nodes hold their policy through ``swarmrl.policy``. The
cheating nodes built on the honest one are in ``swarmrl.attacks``.
"""
