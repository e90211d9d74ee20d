"""Sampled validation: which submissions get the expensive (model) checks, and why cheating still loses.

Every submission gets the cheap checks (schema, seed, tasks, policy, proof shape, replay, rewards). The checks that run
the model (``SAMPLED_CHECKS``: logprobs, toploc, sampling) run before the verdict on

- a node's first ``full_check_first`` submissions (seen by this validator), and
- otherwise with probability ``full_check_rate``, drawn per submission as HMAC-SHA256(validator's secret,
  submission id and file hash): uniform, independent between submissions, and unpredictable to the node, which
  does not know the secret (a fresh random one per validator process unless ``sample_key`` pins it).

A sampled-out submission that passes the cheap checks is accepted (credited, locked for the challenge window);
with probability ``audit_rate`` (a second, independent draw) it is queued for an AUDIT: judged in full when the
validator has nothing pending, while its challenge window is open. A finding then is posted as a challenge:
the accepted submission is rejected, the stake slashed, every credit still in its window revoked, the node
ejected (``orchestrator.verdicts.Verdicts.verdict``).

The arithmetic (``docs/protocol.md``, "Sampled validation"): a submission credits ``G = credit_per_sample x
rows``; cheating on it saves the node at most ``G`` (work that costs more than it pays is not done honestly
either). It is found with probability at least ``p = full_check_rate`` (more with audits), and then the node
loses ``S = slash_fraction x stake``, this submission's credit and every credit in its window (``W >= 0``).
Cheating on a submission is a loss in expectation when ``p (S + G + W) > (1 - p) G``; ``cheating_margin``
checks the sufficient ``p (S + G) >= (1 - p) G`` (no credit in the window counted), which ``RunConfig``
requires of a swarm run that samples.
"""

from __future__ import annotations

import hashlib
import hmac

SAMPLED_CHECKS = ("logprobs", "toploc", "sampling")  # the checks that run the model: what sampling skips


def draw(key: bytes, purpose: str, submission_id: int, sha256: str) -> float:
    """A uniform number in [0, 1) for one submission and purpose ("full", "audit"): HMAC-SHA256 under the
    validator's secret ``key``, so the node cannot compute it from what it knows (its file, its id)."""
    mac = hmac.new(key, f"{purpose}|{submission_id}|{sha256}".encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:8], "big") / 2.0**64


def cheating_margin(full_check_rate: float, stake: float, slash_fraction: float, credit: float) -> float:
    """Expected loss over gain of cheating on one submission, counting only the slash and the submission's own
    credit: ``p (S + G) / ((1 - p) G)``; > 1 means cheating loses in expectation (inf when every submission is
    fully checked)."""
    p = full_check_rate
    if p >= 1.0:
        return float("inf")
    gain = (1.0 - p) * credit
    if gain <= 0:
        return float("inf")
    return p * (slash_fraction * stake + credit) / gain


def min_stake(full_check_rate: float, slash_fraction: float, credit: float) -> float:
    """The smallest stake with ``p (S + G) >= (1 - p) G``: ``G (1 - 2p) / (p slash_fraction)`` (0 from p = 1/2)."""
    p = full_check_rate
    if p >= 0.5:
        return 0.0
    if p <= 0 or slash_fraction <= 0:
        return float("inf")
    return credit * (1.0 - 2.0 * p) / (p * slash_fraction)
