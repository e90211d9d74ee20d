"""Generation: the sampling loop local workers (``rl.worker``) and swarm nodes (``swarm.node``) share. For a batch of
tasks under the run's contract: sample ``group_size`` completions per task (single-turn, turn by turn for a multi-turn
environment, or as verifiers episodes), score them, attach the sampling logprobs and TOPLOC proofs, and return the
rollout rows (``batch.rollout_batch``). It knows nothing of the trainer, the protocol or the run directory: what a
batch is for (worker, step, version, seed) comes in a ``BatchOrigin``, and the caller writes the rows where they go.
"""
