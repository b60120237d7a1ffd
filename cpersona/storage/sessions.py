"""The object :meth:`Database.read` and :meth:`Database.write` hand out: Core first, the ORM on demand.

Every statement the services run is a Core statement (built from
:mod:`cpersona.storage.tables` or the mapped classes' columns, or ``text()``),
and runs on the connection as it is. Only what needs an ORM ``Session``
(``add``, ``flush``, ``begin_nested``, an ORM-enabled statement) creates one,
bound to the same connection and transaction, configured as the sessions
these were before (no autoflush, no expiry on commit). So a stdio start's
reads and its first recall's counter bump never import ``sqlalchemy.orm``
(tests/test_startup.py), and the code that does use ORM objects behaves as
it did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def _orm_enabled(statement: Any) -> bool:
    # As Session.execute itself tells an ORM statement from a Core one.
    return getattr(statement, "_propagate_attrs", {}).get("compile_state_plugin") == "orm"


class CoreSession:
    """A session's execute/scalar/scalars/connection over one connection; anything else through an ORM Session.

    Given an engine, the connection is checked out at the first statement (as
    a Session does), so work before it holds no snapshot open.
    """

    def __init__(self, bind: Engine | Connection) -> None:
        self._bind = bind
        self._conn: Connection | None = bind if isinstance(bind, Connection) else None
        self._owns = self._conn is None  # a connection this object checked out is rolled back and returned here
        self._orm: Session | None = None
        self.info: dict[Any, Any] = {}  # what a caller keeps per session, as Session.info

    def connection(self, **_kw: Any) -> Connection:
        if self._conn is None:
            assert isinstance(self._bind, Engine)
            self._conn = self._bind.connect()
        return self._conn

    def execute(self, statement: Any, params: Any = None, **kw: Any) -> Any:
        if kw.keys() - {"execution_options"} or _orm_enabled(statement):
            return self.orm.execute(statement, params, **kw)
        return self.connection().execute(statement, params, **kw)

    def scalar(self, statement: Any, params: Any = None, **kw: Any) -> Any:
        return self.execute(statement, params, **kw).scalar()

    def scalars(self, statement: Any, params: Any = None, **kw: Any) -> Any:
        return self.execute(statement, params, **kw).scalars()

    @property
    def orm(self) -> Session:
        """The ORM session on this connection, made (and the ORM imported) the first time it is needed."""
        if self._orm is None:
            from sqlalchemy.orm import Session

            self._orm = Session(bind=self.connection(), autoflush=False, expire_on_commit=False)
        return self._orm

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.orm, name)

    def get_transaction(self) -> Any:
        """The connection's transaction, begun if it has not yet (as a Session's is); a new object after a rollback."""
        conn = self.connection()
        if not conn.in_transaction():
            conn.begin()
        return conn.get_transaction()

    def in_transaction(self) -> bool:
        return self._conn is not None and self._conn.in_transaction()

    def rollback(self) -> None:
        """End the connection's transaction (a failed PostgreSQL statement aborts it); the next statement begins anew."""
        if self._orm is not None:
            self._orm.close()  # its objects belonged to the transaction being ended
            self._orm = None
        if self._conn is not None:
            self._conn.rollback()

    def flush(self) -> None:
        if self._orm is not None:
            self._orm.flush()

    def close(self) -> None:
        """End it: the ORM session's own work is dropped, a connection checked out here rolled back and returned."""
        try:
            if self._orm is not None:
                self._orm.close()
        finally:
            self._orm = None
            if self._owns and self._conn is not None:
                conn, self._conn = self._conn, None
                try:
                    conn.rollback()
                finally:
                    conn.close()
