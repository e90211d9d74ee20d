"""TOPLOC: locality-sensitive proofs of inference over last hidden states (arXiv 2501.16007).

- ``proof``: the math and the wire format (build_proofs, encode/decode, interpolation over GF(65497)).
- ``verify``: checking untrusted proofs against recomputed states (verify_proofs, Thresholds).
- ``rollout``: recompute states with one prefill and verify a rollout (verify_rollout).
- ``sampling_check``: were the tokens plausibly sampled from the model (TOPLOC alone does not say).
- ``calibrate``: honest vs tampered distributions and recommended thresholds for a model; ``recommend`` picks
  them, ``thresholds_file`` is the per-model file they are written to.

Building and checking take the same ``ProofGeometry`` (chunk, k; the run's ``contract.proof``):
``build_proofs(hidden, geometry)`` / ``build_proofs_many(hiddens, geometry)`` and
``verify_proofs(hidden, proofs, geometry)``.
"""

from swarmrl.contract.params import PROOF_GEOMETRY, ProofGeometry
from swarmrl.toploc.proof import (
    P,
    ProofError,
    build_proofs,
    build_proofs_many,
    decode_proof,
    encode_proof,
    proof_from_b64,
    proof_len,
    proof_to_b64,
    proofs_from_b64,
    proofs_to_b64,
)
from swarmrl.toploc.rollout import (
    RolloutCheck,
    claim_from_rollout,
    recompute,
    verify_rollout,
    verify_rollouts,
    verify_rows,
)
from swarmrl.toploc.sampling_check import SamplingCheck, SamplingClaim, SamplingThresholds, check_sampling
from swarmrl.toploc.verify import ChunkCheck, Thresholds, verify_proofs

__all__ = [
    "PROOF_GEOMETRY", "ProofGeometry", "P", "ProofError", "build_proofs", "build_proofs_many", "decode_proof",
    "encode_proof", "proof_from_b64", "proof_len", "proof_to_b64", "proofs_from_b64", "proofs_to_b64", "ChunkCheck",
    "Thresholds", "verify_proofs", "RolloutCheck", "verify_rollout", "verify_rollouts", "verify_rows", "recompute",
    "claim_from_rollout", "SamplingClaim", "SamplingThresholds", "SamplingCheck", "check_sampling",
]

