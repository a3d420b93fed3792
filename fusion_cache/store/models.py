"""SQLAlchemy models of the three cache levels, as of the newest migration (head).

Note [Store schema]
    fc_fusions        level 1: definition key -> fusion id (dense from 0, never deleted,
                      so max(id) + 1 never reuses an id)
    fc_plans          level 2: (fusion id, signature key, target) -> plan JSON
    fc_kernels        level 3: kernel key -> cubin, with everything that produced it and its
                      sha256; the database copy is the source of truth, the diskcache tier
                      only a node-local read-through copy
    fc_fusion_kernels which fusion uses which kernel (for `fusion-cache show`); no foreign
                      key to fc_kernels, since a link may be written before its kernel and a
                      pruned kernel leaves its links to be satisfied by a recompile
Tables carry an `fc_` prefix because a cluster may share one PostgreSQL database with other
applications. Times are Unix seconds (floats), the same on every backend.
The migrations in migrations/versions must produce exactly this schema.
"""
from __future__ import annotations

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from .schema import VERSION_TABLE  # noqa: E402,F401  (re-exported)

# Stable constraint names, so later migrations (and SQLite batch mode) can refer to them.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Fusion(Base):
    __tablename__ = "fc_fusions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    definition_key: Mapped[str] = mapped_column(String(), unique=True)
    records_json: Mapped[str] = mapped_column(Text)
    python_definition: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class Plan(Base):
    __tablename__ = "fc_plans"

    fusion_id: Mapped[int] = mapped_column(
        ForeignKey("fc_fusions.id", ondelete="CASCADE"), primary_key=True
    )
    signature_key: Mapped[str] = mapped_column(String(), primary_key=True)
    target: Mapped[str] = mapped_column(String(), primary_key=True)
    plan_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class Kernel(Base):
    __tablename__ = "fc_kernels"

    key: Mapped[str] = mapped_column(String(), primary_key=True)
    kernel_name: Mapped[str] = mapped_column(String())
    arch: Mapped[int] = mapped_column(Integer)
    nvrtc_version: Mapped[str] = mapped_column(String())
    options_json: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    scheduler: Mapped[str] = mapped_column(String())
    params_json: Mapped[str] = mapped_column(Text)
    compile_ms: Mapped[float] = mapped_column(Float)
    sha256: Mapped[str] = mapped_column(String())
    size: Mapped[int] = mapped_column(Integer)
    cubin: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)
    # Added by revision 0002 (usage, for LRU pruning).
    hits: Mapped[int] = mapped_column(Integer, server_default="0")
    last_used: Mapped[float] = mapped_column(Float, server_default="0")

    __table_args__ = (Index("ix_fc_kernels_last_used", "last_used"),)


class FusionKernel(Base):
    __tablename__ = "fc_fusion_kernels"

    fusion_id: Mapped[int] = mapped_column(
        ForeignKey("fc_fusions.id", ondelete="CASCADE"), primary_key=True
    )
    kernel_key: Mapped[str] = mapped_column(String(), primary_key=True)


fusions = Fusion.__table__
plans = Plan.__table__
kernels = Kernel.__table__
fusion_kernels = FusionKernel.__table__
