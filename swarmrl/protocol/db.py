"""Database connection: an engine plus a transaction helper (SQLite file by default, PostgreSQL by URL)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from swarmrl.protocol.tables import Base


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


class Database:
    """Owns the engine. ``tx()`` is one transaction: committed on success, rolled back on error.

    SQLite allows one writer at a time; transactions there are serialised by a process-wide lock
    (so two request threads never fight over the file lock). PostgreSQL runs them concurrently.
    """

    def __init__(self, url: str, echo: bool = False) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
                Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(url, echo=echo,
                                                connect_args={"check_same_thread": False, "timeout": 30})

            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn, _rec) -> None:  # noqa: ANN001
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()
        else:
            self.engine = create_engine(url, echo=echo, pool_size=10, max_overflow=20, pool_pre_ping=True)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._lock = threading.RLock() if self.is_sqlite else None
        # called with the session's ``info`` dict after each successful commit (the orchestrator drops the
        # in-memory state of what a transaction changed: ``s.info["dirty"]``)
        self.after_commit: Callable[[dict], None] | None = None

    def create_all(self) -> None:
        Base.metadata.create_all(self.engine)

    def drop_all(self) -> None:
        Base.metadata.drop_all(self.engine)

    @contextmanager
    def tx(self) -> Iterator[Session]:
        if self._lock is not None:
            self._lock.acquire()
        try:
            with self._sessions() as s:
                with s.begin():
                    yield s
                if s.info and self.after_commit is not None:
                    self.after_commit(s.info)
        finally:
            if self._lock is not None:
                self._lock.release()

    def dispose(self) -> None:
        self.engine.dispose()
