"""The ledger: append-only rows; deposits, stakes, credits locked for a challenge window, slashing.

The functions are the bookkeeping rules over a session (the caller's transaction); ``Ledger`` is the service the
rest of the orchestrator calls, with the run's amounts (``credit_per_sample``, ``challenge_window_s``,
``slash_fraction``) and the public balance view. Balances are sums. A stake authority's ``deposit`` row funds a node; registering locks part of it as a
``stake`` row (what is deposited and not locked is ``deposit_available``). A credit carries ``unlock_at`` (end of
its challenge window); slashing a node appends a ``slash`` row (a fraction of its stake) and one ``revoke`` row
per credit still inside its window, each referencing the credit it cancels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.errors import ProtocolError
from swarmrl.protocol.schemas import Balance, LedgerRow
from swarmrl.protocol.tables import LedgerEntry, Node


def add(s: Session, node_id: str, kind: str, amount: float, *, submission_id: int | None = None,
        ref_id: int | None = None, unlock_at: float | None = None, note: str | None = None,
        now: float | None = None) -> LedgerEntry:
    row = LedgerEntry(node_id=node_id, kind=kind, amount=float(amount), submission_id=submission_id, ref_id=ref_id,
                      unlock_at=unlock_at, created_at=time.time() if now is None else now, note=note)
    s.add(row)
    s.flush()
    return row


def stake_of(s: Session, node_id: str) -> float:
    q = select(func.coalesce(func.sum(LedgerEntry.amount), 0.0)).where(
        LedgerEntry.node_id == node_id, LedgerEntry.kind.in_(("stake", "slash")))
    return float(s.execute(q).scalar_one())


def deposit_available(s: Session, node_id: str) -> float:
    """Deposited for the node and not locked as stake (never below 0: self-declared stakes have no deposit)."""
    q = select(LedgerEntry.kind, func.coalesce(func.sum(LedgerEntry.amount), 0.0)).where(
        LedgerEntry.node_id == node_id, LedgerEntry.kind.in_(("deposit", "stake"))).group_by(LedgerEntry.kind)
    sums = {k: float(v) for k, v in s.execute(q).all()}
    return max(0.0, sums.get("deposit", 0.0) - sums.get("stake", 0.0))


def credit(s: Session, node_id: str, amount: float, submission_id: int, window_s: float,
           now: float | None = None) -> LedgerEntry:
    now = time.time() if now is None else now
    return add(s, node_id, "credit", amount, submission_id=submission_id, unlock_at=now + window_s, now=now,
               note="accepted samples")


def credits_in_window(s: Session, node_id: str, now: float) -> list[LedgerEntry]:
    revoked = select(LedgerEntry.ref_id).where(LedgerEntry.node_id == node_id, LedgerEntry.kind == "revoke",
                                               LedgerEntry.ref_id.is_not(None))
    q = select(LedgerEntry).where(LedgerEntry.node_id == node_id, LedgerEntry.kind == "credit",
                                  LedgerEntry.unlock_at > now, LedgerEntry.id.not_in(revoked))
    return list(s.execute(q).scalars())


@dataclass
class SlashResult:
    slashed: float
    revoked: float


def slash(s: Session, node_id: str, fraction: float, reason: str, submission_id: int | None = None,
          now: float | None = None) -> SlashResult:
    now = time.time() if now is None else now
    stake = stake_of(s, node_id)
    amount = max(0.0, stake) * fraction
    if amount > 0:
        add(s, node_id, "slash", -amount, submission_id=submission_id, now=now, note=reason[:500])
    revoked = 0.0
    for c in credits_in_window(s, node_id, now):
        add(s, node_id, "revoke", -c.amount, submission_id=c.submission_id, ref_id=c.id, now=now,
            note=f"revoked by slash: {reason[:200]}")
        revoked += c.amount
    return SlashResult(amount, revoked)


@dataclass
class Balances:
    stake: float
    credits_locked: float
    credits_unlocked: float
    deposited: float = 0.0  # deposit not locked as stake


def balances(s: Session, node_id: str, now: float | None = None) -> Balances:
    now = time.time() if now is None else now
    rows = list(s.execute(select(LedgerEntry).where(LedgerEntry.node_id == node_id)).scalars())
    revoked = {r.ref_id for r in rows if r.kind == "revoke"}
    stake = sum(r.amount for r in rows if r.kind in ("stake", "slash"))
    locked = sum(r.amount for r in rows if r.kind == "credit" and r.id not in revoked and (r.unlock_at or 0) > now)
    unlocked = sum(r.amount for r in rows if r.kind == "credit" and r.id not in revoked and (r.unlock_at or 0) <= now)
    deposited = max(0.0, sum(r.amount for r in rows if r.kind == "deposit")
                    - sum(r.amount for r in rows if r.kind == "stake"))
    return Balances(stake, locked, unlocked, deposited)


class Ledger:
    """The ledger service: deposits, locked stakes, credits for accepted work, slashes, and a node's balance.
    Every method but ``balance`` writes inside the caller's transaction (``s``), so a verdict's credit or a
    registration's stake commits with the rest of it."""

    def __init__(self, cfg: OrchestratorConfig, db: Database) -> None:
        self._cfg = cfg
        self._db = db

    @staticmethod
    def deposit(s: Session, node_id: str, amount: float, note: str, now: float) -> tuple[LedgerEntry, float]:
        """A stake authority's deposit for ``node_id``; returns its row and what the node may now lock."""
        row = add(s, node_id, "deposit", amount, now=now, note=note)
        return row, deposit_available(s, node_id)

    @staticmethod
    def available(s: Session, node_id: str) -> float:
        """Deposited for the node and not locked as stake."""
        return deposit_available(s, node_id)

    @staticmethod
    def lock_stake(s: Session, node_id: str, amount: float, now: float) -> None:
        add(s, node_id, "stake", amount, now=now, note="stake locked at registration")

    def credit(self, s: Session, node_id: str, submission_id: int, n_rows: int, now: float) -> float:
        """Credit accepted work (``credit_per_sample`` per row, locked for ``challenge_window_s``); the amount."""
        amount = self._cfg.credit_per_sample * n_rows
        credit(s, node_id, amount, submission_id, self._cfg.challenge_window_s, now=now)
        return amount

    @staticmethod
    def credited_in_window(s: Session, node_id: str, submission_id: int, now: float) -> bool:
        """Whether the credit of this submission is still inside its challenge window (and not revoked)."""
        return any(c.submission_id == submission_id for c in credits_in_window(s, node_id, now))

    def credit_round(self, s: Session, node_id: str, note: str, now: float) -> float:
        """Credit an accepted DiLoCo pseudo-gradient (``diloco_credit_per_round``, locked for
        ``challenge_window_s``, no submission); the amount."""
        amount = self._cfg.diloco_credit_per_round
        add(s, node_id, "credit", amount, unlock_at=now + self._cfg.challenge_window_s, now=now, note=note[:500])
        return amount

    def slash(self, s: Session, node_id: str, reason: str, submission_id: int | None, now: float) -> SlashResult:
        """Slash ``slash_fraction`` of the node's stake and revoke its credits still in their window."""
        return slash(s, node_id, self._cfg.slash_fraction, reason, submission_id=submission_id, now=now)

    def balance(self, node_id: str, now: float | None = None) -> Balance:
        """A node's balances and ledger rows (``GET /v1/nodes/{id}/ledger``); 404 for an unknown node."""
        with self._db.tx() as s:
            node = s.get(Node, node_id)
            if node is None:
                raise ProtocolError(404, f"no node {node_id}")
            b = balances(s, node_id, now)
            rows = s.execute(select(LedgerEntry).where(LedgerEntry.node_id == node_id).order_by(LedgerEntry.id)
                             ).scalars().all()
            return Balance(node_id=node_id, status=node.status, stake=b.stake, credits_locked=b.credits_locked,
                           credits_unlocked=b.credits_unlocked, deposited=b.deposited,
                           entries=[LedgerRow(id=r.id, kind=r.kind, amount=r.amount, submission_id=r.submission_id,
                                              ref_id=r.ref_id, unlock_at=r.unlock_at, created_at=r.created_at,
                                              note=r.note) for r in rows])
