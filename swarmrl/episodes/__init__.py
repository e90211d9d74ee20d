"""Episodes: environments run against a model. ``turns``: a ``MultiTurnEnvironment``'s trajectories sampled turn
by turn with our backends; ``vf``: verifiers episodes over the token-in/token-out chat endpoint, and their replay.

Used by the sampling loop of workers and nodes (``swarmrl.generation``), held-out evaluation (``swarmrl.eval``) and the validator's
replay (``swarmrl.protocol.replay``); it imports ``envs`` (what an environment is) and ``inference`` (how a model
samples), which import neither it nor each other."""
