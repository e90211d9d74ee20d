"""swarmrl: reinforcement learning for language models over a decentralized swarm.

One subpackage per component:

- ``swarmrl.models``    tiny HF models and local tokenizers, loading any HF causal LM
- ``swarmrl.envs``      tasks and verifiers (arithmetic, math, code, reasoning-gym, verifiers, the tool task calc)
- ``swarmrl.inference`` batched sampling with KV cache, logprobs and hidden-state capture; the chat endpoint
- ``swarmrl.episodes``  environments run against a model: multi-turn trajectories, verifiers episodes, replay
- ``swarmrl.sft``       supervised warm start
- ``swarmrl.eval``      held-out evaluation
- ``swarmrl.rl``        asynchronous GRPO: loss, advantages, filtering, trainer, workers
- ``swarmrl.toploc``    verifiable-inference proofs
- ``swarmrl.shardcast`` checkpoint broadcast through HTTP relays
- ``swarmrl.protocol``  permissionless nodes, signed work, validation, ledger
- ``swarmrl.diloco``    low-communication data-parallel training
- ``swarmrl.cli``       the thin ``swarmrl`` command line (nothing imports it)
"""

__version__ = "0.1.0"
