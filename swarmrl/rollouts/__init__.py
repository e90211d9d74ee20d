"""Rollouts between the roles: the layer below both the trainer (``rl``) and the protocol (``protocol``).

- ``wire``: the rollout file format: the parquet ``SCHEMA`` of ``swarmrl.contract.Rollout`` rows, the atomic
  writer and the checked readers of untrusted files (``read_rollouts``, ``check_rollouts``, ``read_group_keys``)
  under ``RolloutLimits``.
- ``limits``: ``RolloutLimits``, what one file may hold decoded, declared once (the orchestrator's config holds
  it as its ``[rollout_limits]`` section; every other reader takes the defaults).
- ``packing``: rows as model input (``Sequence``, ``pack``) and their logprobs under a model
  (``sequence_logprobs``): what the trainer's update and the validator's logprob re-check both run.
- ``shared``: a group's rows behind one copy of their prompt (``pack_shared``, ``shared_logprobs``): the trainer's
  update gets the same logprobs from fewer tokens.
"""

from swarmrl.utils.lazy import lazy_exports

_WIRE = ("SCHEMA", "BATCH_ROWS", "GroupKey", "RolloutError", "RolloutTooLarge", "check_rollouts",
         "metadata_decoded_bytes", "read_group_keys", "read_rollouts", "to_table", "write_rollouts")
_PACKING = ("Sequence", "pack", "sequence_logprobs")
__all__ = [*_WIRE, *_PACKING, "RolloutLimits"]

# lazy: the wire format pulls in pyarrow (the orchestrator loads it only for an upload), packing torch
__getattr__ = lazy_exports({**{n: "swarmrl.rollouts.wire" for n in _WIRE},
                            **{n: "swarmrl.rollouts.packing" for n in _PACKING},
                            "RolloutLimits": "swarmrl.rollouts.limits"})
