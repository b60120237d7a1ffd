"""The embedding identity of a database: which model made its stored vectors.

Rows hold a vector but not the name of what produced it (the v13 layout has no
label column), so a database switched to another model of the same width would
have its old vectors compared with the new model's queries — numbers that
mean nothing to each other. One row records the model (its fingerprint or
name) and width in force; when a server starts with another one, the stored
vectors are cleared and the backfill re-embeds them
(``cpersona.services.records.vector_identity``).

A table name the 2.6 line does not use, so the reference opens the file
unchanged. Recorded in ``alembic_version`` only; ``schema_version`` stays 13
(decision 8).

Revision ID: 0005_embedding_identity
Revises: 0004_record_nodes
"""

from __future__ import annotations

from alembic import op

revision = "0005_embedding_identity"
down_revision = "0004_record_nodes"
branch_labels = None
depends_on = None

TABLE_DDL = """CREATE TABLE IF NOT EXISTS embedding_identity (
  id           INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  label        TEXT    NOT NULL,
  dimension    INTEGER,
  recorded_at  TEXT    NOT NULL)"""


def upgrade() -> None:
    op.execute(TABLE_DDL)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS embedding_identity")
