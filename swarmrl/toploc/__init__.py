"""TOPLOC: locality-sensitive proofs of inference over last hidden states (arXiv 2501.16007).

- ``proof``: the math and the wire format (build_proofs, encode/decode, interpolation over GF(65497)).
- ``verify``: checking untrusted proofs against recomputed states (verify_proofs, Thresholds).
- ``rollout``: recompute states with one prefill and verify a rollout (verify_rollout).
- ``sampling_check``: were the tokens plausibly sampled from the model (TOPLOC alone does not say).
- ``calibrate``: honest vs tampered distributions and recommended thresholds for a model.
"""

from swarmrl.toploc.proof import (
    P,
    ProofError,
    build_proofs,
    decode_proof,
    encode_proof,
    proof_from_b64,
    proof_len,
    proof_to_b64,
    proofs_for_sample,
    proofs_for_samples,
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
    "P", "ProofError", "build_proofs", "decode_proof", "encode_proof", "proof_from_b64", "proof_len", "proof_to_b64",
    "proofs_for_sample", "proofs_for_samples", "proofs_from_b64", "proofs_to_b64", "ChunkCheck", "Thresholds", "verify_proofs", "RolloutCheck", "verify_rollout",
    "verify_rollouts", "verify_rows", "recompute", "claim_from_rollout", "SamplingClaim", "SamplingThresholds", "SamplingCheck", "check_sampling",
]

