"""The job store's tables (SQLAlchemy declarative rows) and the errors a store raises; the queries live in
:mod:`frenzy_opt.service.store`, the writer's lease in :mod:`frenzy_opt.service.writer`."""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_key"),
        Index("ix_jobs_tenant_state", "tenant", "state"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)
    """Acceptance order (the queue order after a restart)."""
    tenant: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    spec_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Launches of any kind (first runs, retries, moves)."""
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Attempts that failed on their own (what ``max_retries`` bounds)."""
    moves: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Attempts the scheduler stopped or lost (preemption, growth, a restart of the service)."""
    max_retries: Mapped[int] = mapped_column(Integer, default=2)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    plan_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    placement_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    predicted_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    measured_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class EventRow(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str] = mapped_column(Text, default="")


class CalibrationRow(Base):
    """A fitted efficiency of the step-time model (closed loop), per ``GPU@precision``."""

    __tablename__ = "calibration"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    efficiency: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    report_json: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


ADDED_COLUMNS = {"jobs": {"failures": "INTEGER NOT NULL DEFAULT 0", "moves": "INTEGER NOT NULL DEFAULT 0"}}
"""Columns added after the first release: an older store gets them at start (0 for every row)."""


class StoreUnavailable(RuntimeError):
    """The store cannot take writes now (its file is gone, the disk is full, a lock is held too long)."""


class StoreFenced(StoreUnavailable):
    """Another service took the store over: this one must not write again."""


class StoreRefused(RuntimeError):
    """The service must not start on this store (the subclasses say why)."""


class StoreInUse(StoreRefused):
    """Another service holds the store's writer lock."""


class StoreCorrupt(StoreRefused):
    """The database fails its integrity check: the service does not start on it."""


class StoreMissing(StoreRefused):
    """The store does not exist and was not to be created."""


class StoreSchema(StoreRefused):
    """The database holds tables of another shape."""
