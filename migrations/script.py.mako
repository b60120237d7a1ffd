"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}

# Rules for cpersona revisions (spec storage.md §9):
# - never batch-alter memories / episodes or any table carrying triggers
#   (IMPL-3): ADD COLUMN with a constant default, CREATE TABLE / INDEX / TRIGGER;
# - raw DDL through op.execute for FTS5 / vec0 objects and triggers;
# - do not insert schema_version rows: it stays 13 (spec README decision 8).


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
