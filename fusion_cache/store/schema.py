"""Schema facts that code without SQLAlchemy needs (the warm read path, Note [Warm path]):
the version table's name and the newest revision. models.py and migrations/ define the
schema itself; tests/test_store_migrations.py checks HEAD_REVISION against Alembic's head."""

VERSION_TABLE = "fc_alembic_version"

# The newest revision in migrations/versions: a store already here opens with one read of
# the version table, without Alembic or SQLAlchemy.
HEAD_REVISION = "0002"
