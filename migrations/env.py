"""Alembic environment for the fusion-cache store.

Run programmatically by fusion_cache.store.migrate, which passes an open connection (inside
its own transaction, under the migration lock) as config.attributes["connection"]. Without
one (someone running Alembic by hand with sqlalchemy.url set), an engine is built from the URL.
"""
from alembic import context

from fusion_cache.store.engine import create_store_engine, env_timeout, resolve_location
from fusion_cache.store.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection) -> None:
    # SQLite alters most columns only by copying the table: batch mode does that for us.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    loc = resolve_location(config.get_main_option("sqlalchemy.url"), None)
    engine = create_store_engine(loc, env_timeout())
    try:
        with engine.connect() as connection:
            _run_on(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
