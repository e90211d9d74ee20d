"""swarmrl: reinforcement learning for language models over a decentralized swarm.

One subpackage per component (docs/architecture.md draws their layers; a package imports only lower ones):

- ``swarmrl.rundir``     the run directory: layout, the trainer's records, committed versions, the writer
- ``swarmrl.models``     tiny HF models and local tokenizers, loading any HF causal LM, LoRA adapters
- ``swarmrl.envs``       tasks and verifiers (arithmetic, math, code, reasoning-gym, verifiers, the tool task calc)
- ``swarmrl.shardcast``  checkpoint broadcast through HTTP relays (client/, server/)
- ``swarmrl.contract``   the rules every role shares
- ``swarmrl.inference``  batched sampling with KV cache, logprobs and hidden-state capture; the chat endpoint
- ``swarmrl.training``   the builders every training loop is assembled from (model, parallelism, AdamW, schedule)
- ``swarmrl.episodes``   environments run against a model: multi-turn trajectories, verifiers episodes, replay
- ``swarmrl.toploc``     verifiable-inference proofs
- ``swarmrl.policy``     where policy versions come from and the holders that swap them in place
- ``swarmrl.rollouts``   the rollout wire format and the packing of rows as model input
- ``swarmrl.diloco``     low-communication data-parallel training
- ``swarmrl.generation`` the sampling loop local workers and swarm nodes share
- ``swarmrl.eval``       held-out evaluation
- ``swarmrl.protocol``   permissionless nodes, signed work, the orchestrator's services, validation, ledger
- ``swarmrl.rl``         asynchronous GRPO: the trainer, the loss registry, the local worker
- ``swarmrl.sft``        supervised warm start
- ``swarmrl.swarm``      the RL loop over the protocol: the honest node, the trainer's adapter
- ``swarmrl.attacks``    hostile peers for demos, tests and benchmarks
- ``swarmrl.job``        ``swarmrl run``: one config, derived into every role's, supervised
- ``swarmrl.cli``        the thin ``swarmrl`` command line (nothing imports it)
"""

__version__ = "0.1.0"
