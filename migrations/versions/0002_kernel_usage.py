"""Kernel usage (hit count, last use) for least-recently-used pruning.

Existing kernels start with no hits and last_used = created_at, so pruning right after the
upgrade removes the oldest first.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOT NULL columns with a server default: a plain ADD COLUMN on SQLite and PostgreSQL.
    op.add_column(
        "fc_kernels", sa.Column("hits", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "fc_kernels", sa.Column("last_used", sa.Float(), nullable=False, server_default="0")
    )
    op.execute("UPDATE fc_kernels SET last_used = created_at")
    op.create_index("ix_fc_kernels_last_used", "fc_kernels", ["last_used"])


def downgrade() -> None:
    op.drop_index("ix_fc_kernels_last_used", table_name="fc_kernels")
    with op.batch_alter_table("fc_kernels") as batch:
        batch.drop_column("last_used")
        batch.drop_column("hits")
