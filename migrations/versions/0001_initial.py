"""The three cache levels: fusions, plans, kernels, and fusion-kernel links.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fc_fusions",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("definition_key", sa.String(), nullable=False),
        sa.Column("records_json", sa.Text(), nullable=False),
        sa.Column("python_definition", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fc_fusions"),
        sa.UniqueConstraint("definition_key", name="uq_fc_fusions_definition_key"),
    )
    op.create_table(
        "fc_plans",
        sa.Column("fusion_id", sa.Integer(), nullable=False),
        sa.Column("signature_key", sa.String(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("plan_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["fusion_id"], ["fc_fusions.id"], name="fk_fc_plans_fusion_id", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("fusion_id", "signature_key", "target", name="pk_fc_plans"),
    )
    op.create_table(
        "fc_kernels",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("kernel_name", sa.String(), nullable=False),
        sa.Column("arch", sa.Integer(), nullable=False),
        sa.Column("nvrtc_version", sa.String(), nullable=False),
        sa.Column("options_json", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("scheduler", sa.String(), nullable=False),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("compile_ms", sa.Float(), nullable=False),
        sa.Column("sha256", sa.String(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("cubin", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_fc_kernels"),
    )
    op.create_table(
        "fc_fusion_kernels",
        sa.Column("fusion_id", sa.Integer(), nullable=False),
        sa.Column("kernel_key", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(
            ["fusion_id"],
            ["fc_fusions.id"],
            name="fk_fc_fusion_kernels_fusion_id",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("fusion_id", "kernel_key", name="pk_fc_fusion_kernels"),
    )


def downgrade() -> None:
    op.drop_table("fc_fusion_kernels")
    op.drop_table("fc_kernels")
    op.drop_table("fc_plans")
    op.drop_table("fc_fusions")
