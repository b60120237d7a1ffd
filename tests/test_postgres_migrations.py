"""The Alembic history on PostgreSQL: same revisions, PostgreSQL DDL (spec IMPL-2,
IMPL-4, decision 8 — schema_version stays 13), pg_trgm in place of FTS5."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from cpersona.config import load_settings
from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import (
    alembic_config,
    include_object_for,
    head_revision,
    open_database_and_upgrade,
    upgrade,
)
from cpersona.storage.models import Base
from pg_support import fresh_pg_url

TABLES = {
    "schema_version",
    "memories",
    "episodes",
    "profiles",
    "pending_memory_tasks",
    "entities",
    "entity_aliases",
    "entity_mentions",
    "relations",
    "record_nodes",
    "embedding_identity",
    "alembic_version",
    # revision 0009: the change log the held near windows follow (storage/vector_near_postgres.py)
    "vector_changes",
    "vector_change_state",
}


@pytest.fixture
def pg_db():
    with fresh_pg_url() as url:
        db = open_postgres(url)
        upgrade(db)
        yield db
        db.close()


def q(db, sql, **params):
    with db.read() as session:
        return [tuple(r) for r in session.execute(text(sql), params)]


def tables(db):
    return {r[0] for r in q(db, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}


def test_fresh_upgrade_creates_the_tables_trgm_indexes_and_version_13(pg_db):
    # spec README decision 8: schema_version 13 whatever our head revision is
    assert tables(pg_db) == TABLES
    assert q(pg_db, "SELECT version FROM schema_version") == [(13,)]
    assert q(pg_db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    trgm = {r[0] for r in q(pg_db, "SELECT indexname FROM pg_indexes WHERE indexdef LIKE '%gin_trgm_ops%'")}
    assert trgm == {"idx_memories_content_trgm", "idx_episodes_summary_trgm", "idx_episodes_keywords_trgm"}


def test_upgrade_is_idempotent(pg_db):
    upgrade(pg_db)
    upgrade(pg_db)
    assert q(pg_db, "SELECT version FROM schema_version") == [(13,)]


def test_downgrade_to_base_and_back(pg_db):
    with pg_db.write_connection() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert tables(pg_db) == {"alembic_version"}
    assert q(pg_db, "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal") == [(0,)]
    upgrade(pg_db)
    assert tables(pg_db) == TABLES
    # 7 of ours and revision 0009's 8 (4 a table: vector_near_postgres.triggers_ddl); the 2 that keep
    # pgvector's column in step exist only where the server has pgvector
    assert q(
        pg_db,
        "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal"
        " AND tgname NOT IN ('memories_embedding_vec_sync', 'episodes_embedding_vec_sync')",
    ) == [(15,)]


def test_models_match_the_migrated_schema(pg_db):
    # spec IMPL-4. Server defaults are compared on SQLite only: the models state
    # SQLite's datetime('now'); PostgreSQL's default is the same text by to_char.
    with pg_db.engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "include_object": include_object_for("postgresql"),
                "include_name": lambda name, type_, parents: name != "alembic_version",
            },
        )
        diffs = [d[0] if isinstance(d, list) else d for d in compare_metadata(context, Base.metadata)]
    # A PostgreSQL primary key is NOT NULL; the models say nullable for SQLite's
    # "INTEGER PRIMARY KEY" (see models.py). That is the only difference allowed.
    primary_keys = {(t.name, c.name) for t in Base.metadata.tables.values() for c in t.primary_key}
    assert [d for d in diffs if not (d[0] == "modify_nullable" and (d[2], d[3]) in primary_keys)] == []


def test_a_postgresql_engine_gives_the_models_partial_indexes_the_migrated_predicates(pg_db):
    # The models say each partial index's predicate once (SQLite's option, so a
    # SQLite start never loads the PostgreSQL dialect); a PostgreSQL engine adds
    # it as PostgreSQL's own. The drift comparison ignores predicates, so this
    # holds the models to the migrated indexes directly.
    from sqlalchemy.schema import CreateIndex

    partial = {
        index.name: index
        for table in Base.metadata.tables.values()
        for index in table.indexes
        if index.dialect_options["sqlite"]["where"] is not None
    }
    assert sorted(partial) == [
        "idx_episodes_lost_embedding",
        "idx_memories_dedup_msg_id",
        "idx_memories_lost_embedding",
    ]
    migrated = dict(
        q(pg_db, "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(:names)", names=list(partial))
    )
    for name, index in partial.items():
        model_ddl = str(CreateIndex(index).compile(dialect=pg_db.engine.dialect))
        column = str(index.dialect_options["sqlite"]["where"]).split()[0]
        assert f" WHERE {column} " in model_ddl, model_ddl
        assert f"WHERE ({column} " in migrated[name], migrated[name]


def test_defaults_ids_and_dedup_rules(pg_db):
    with pg_db.write_connection() as conn:
        long_text = "x" * 20_000  # beyond a B-tree entry: dedup is over md5(content)
        conn.execute(
            text("INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', :c, 't')"), {"c": long_text}
        )
    row = q(pg_db, "SELECT id, project_id, source, metadata, created_at FROM memories")[0]
    assert row[1:4] == ("", "{}", "{}")
    assert len(row[4]) == 19 and row[4][10] == " "  # 'YYYY-MM-DD HH:MM:SS', as SQLite writes it
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):  # spec DB-5
        with pg_db.write_connection() as conn:
            conn.execute(
                text("INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', :c, 't')"), {"c": long_text}
            )
    with pytest.raises(IntegrityError):  # spec DB-6: msg_id unique per bucket when not ''
        with pg_db.write_connection() as conn:
            for c in ("one", "two"):
                conn.execute(
                    text("INSERT INTO memories (agent_id, msg_id, content, timestamp) VALUES ('a', 'm1', :c, 't')"),
                    {"c": c},
                )


def test_deleting_or_editing_a_memory_cascades_like_the_sqlite_triggers(pg_db):
    # LR-1 / LR-2 on PostgreSQL trigger functions
    with pg_db.write_connection() as conn:
        mid = conn.execute(
            text("INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', 'c', 't') RETURNING id")
        ).scalar_one()
        conn.execute(
            text(
                'INSERT INTO record_nodes (parent_kind, parent_id, node_index, start_char, end_char, token_count, "window")'
                " VALUES ('mem', :id, 0, 0, 1, 1, 1)"
            ),
            {"id": mid},
        )
        conn.execute(
            text("INSERT INTO entity_mentions (entity_id, ref, declared_by, created_at) VALUES (1, :r, 'x', 't')"),
            {"r": f"mem:{mid}"},
        )
        conn.execute(text("UPDATE memories SET recall_count = 1 WHERE id = :id"), {"id": mid})
    assert q(pg_db, "SELECT count(*) FROM record_nodes") == [(1,)]  # a counter bump keeps nodes
    with pg_db.write_connection() as conn:
        conn.execute(text("UPDATE memories SET content = 'd' WHERE id = :id"), {"id": mid})
    assert q(pg_db, "SELECT count(*) FROM record_nodes") == [(0,)]
    with pg_db.write_connection() as conn:
        conn.execute(text("DELETE FROM memories WHERE id = :id"), {"id": mid})
    assert q(pg_db, "SELECT count(*) FROM entity_mentions") == [(0,)]


def test_settings_with_a_database_url_open_postgres_at_head():
    with fresh_pg_url() as url:
        db = open_database_and_upgrade(load_settings({"CPERSONA_DATABASE_URL": url}))
        try:
            assert db.dialect == "postgresql"
            assert q(db, "SELECT version FROM schema_version") == [(13,)]
        finally:
            db.close()
