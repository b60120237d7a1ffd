"""SQL lives in storage (issue 18 part 2): no service module builds or runs SQL itself.

The scan reads every module under ``cpersona/services`` as an AST and flags:

- imports of SQLAlchemy names that build SQL (``text``, ``select``, ``insert``,
  ``update``, ``delete``, ``func``, ``and_`` …, or the whole ``sqlalchemy``
  module); the types a service may still hold (a ``Session`` or ``Connection``
  handed to a repository, a ``Row``) and ``sqlalchemy.exc`` are allowed;
- the scope's SQL builders (``predicates``, ``sql_fragment``): the isolation
  predicate is applied by the repositories, once;
- ``exec_driver_sql`` / ``executescript`` / ``executemany`` anywhere, and
  ``.execute`` / ``.scalar`` / ``.scalars`` whose statement is SQL written in
  the module: a string (literal, f-string, concatenation), a name bound to one,
  or a statement built there (``Model.__table__.insert()`` and its chain);
- ORM queries (``session.query``);
- SQL text anywhere in the module (a string that starts like a statement:
  ``SELECT …``, ``UPDATE t SET``, ``DELETE FROM``, ``PRAGMA`` …), whatever helper
  it is handed to.

Modules not yet moved are listed in ``NOT_YET_MOVED``; the list may only shrink:
a listed module that is already clean fails the test too, so the list always says
exactly what remains.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "cpersona" / "services"

# Names a service may import from SQLAlchemy: handles and rows it passes along, not SQL.
ALLOWED_SQLALCHEMY_NAMES = frozenset({"Connection", "Engine", "Row", "Session"})
ALLOWED_SQLALCHEMY_MODULES = ("sqlalchemy.exc",)
SCOPE_SQL_BUILDERS = frozenset({"predicates", "sql_fragment"})
ALWAYS_SQL_METHODS = frozenset({"exec_driver_sql", "executescript", "executemany"})
STATEMENT_METHODS = frozenset({"execute", "scalar", "scalars"})
# Methods that build a Core statement from a table (``Model.__table__.insert()`` …).
BUILDER_METHODS = frozenset(
    {"insert", "update", "delete", "select", "where", "values", "returning", "on_conflict_do_nothing"}
)

# The start of an SQL statement, as written in code (keywords upper case, as this project writes them).
SQL_TEXT = re.compile(
    r"^\s*\(?\s*(SELECT\s|INSERT\s+(OR\s+\w+\s+)?INTO\s|UPDATE\s+(OR\s+\w+\s+)?\w+\s+SET\s|DELETE\s+FROM\s"
    r"|PRAGMA\s|CREATE\s|DROP\s|WITH\s+\w+\s+AS\s)"
)

# Modules still running SQL themselves: the work left (may only shrink).
NOT_YET_MOVED: frozenset[str] = frozenset()


def _is_sql_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _is_sql_string(node.left) or _is_sql_string(node.right)
    return False


def _is_built_statement(node: ast.AST) -> bool:
    """A Core statement built in place: ``X.__table__.insert()…`` or a chain ending in a builder method."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in BUILDER_METHODS:
            return True
        node = node.func.value
    return isinstance(node, ast.Attribute) and node.attr == "__table__"


class _Scanner(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.problems: list[str] = []
        # Names the module binds to SQL text or a built statement (any scope: a coarse but honest net).
        self.sql_names = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            if _is_sql_string(node.value) and _looks_like_sql(node.value) or _is_built_statement(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and SQL_TEXT.match(node.value):
            self.problems.append(f"line {node.lineno}: SQL text {node.value[:40]!r}")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        first = node.values[0] if node.values else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and SQL_TEXT.match(first.value):
            self.problems.append(f"line {node.lineno}: SQL text {first.value[:40]!r}")
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if (
                alias.name == "sqlalchemy"
                or alias.name.startswith("sqlalchemy.")
                and not alias.name.startswith(ALLOWED_SQLALCHEMY_MODULES)
            ):
                self.problems.append(f"line {node.lineno}: import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module == "sqlalchemy" or module.startswith("sqlalchemy."):
            if not module.startswith(ALLOWED_SQLALCHEMY_MODULES):
                for alias in node.names:
                    if alias.name not in ALLOWED_SQLALCHEMY_NAMES:
                        self.problems.append(f"line {node.lineno}: from {module} import {alias.name}")
        elif module == "cpersona.storage.scope":
            for alias in node.names:
                if alias.name in SCOPE_SQL_BUILDERS:
                    self.problems.append(f"line {node.lineno}: from {module} import {alias.name}")

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ALWAYS_SQL_METHODS:
                self.problems.append(f"line {node.lineno}: .{method}()")
            elif method == "query":
                receiver = node.func.value
                if isinstance(receiver, ast.Name) and receiver.id in {"session", "s"}:
                    self.problems.append(f"line {node.lineno}: session.query()")
            elif method in STATEMENT_METHODS and node.args:
                statement = node.args[0]
                if (
                    _is_sql_string(statement)
                    or _is_built_statement(statement)
                    or isinstance(statement, ast.Name)
                    and statement.id in self.sql_names
                ):
                    self.problems.append(f"line {node.lineno}: .{method}() of SQL written here")
        self.generic_visit(node)


def _looks_like_sql(node: ast.AST) -> bool:
    words = " ".join(
        part.value for part in ast.walk(node) if isinstance(part, ast.Constant) and isinstance(part.value, str)
    ).upper()
    return any(word in words for word in ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "PRAGMA ", "CREATE ", "DROP "))


def scan(source: str) -> list[str]:
    tree = ast.parse(source)
    scanner = _Scanner(tree)
    scanner.visit(tree)
    return scanner.problems


def _service_modules() -> dict[str, Path]:
    return {path.relative_to(SERVICES).as_posix(): path for path in sorted(SERVICES.rglob("*.py"))}


def test_the_scanner_catches_each_way_of_writing_sql():
    """The net itself: each construct it names is caught, and plain service code is not."""
    caught = {
        "from sqlalchemy import text": "from sqlalchemy import text",
        "from sqlalchemy import select, func": "from sqlalchemy import select",
        "import sqlalchemy as sa": "import sqlalchemy",
        "from sqlalchemy.dialects.sqlite import insert": "from sqlalchemy.dialects.sqlite import insert",
        "from cpersona.storage.scope import Scope, predicates": "import predicates",
        "conn.exec_driver_sql('x')": ".exec_driver_sql()",
        "raw.executescript(s)": ".executescript()",
        "conn.execute('SELECT 1')": ".execute() of SQL",
        "conn.execute(f'PRAGMA {x}')": ".execute() of SQL",
        "Q = 'SELECT id FROM t'\ndef f(s):\n    return s.execute(Q)": ".execute() of SQL",
        "s.execute(Entity.__table__.insert().values(a=1))": ".execute() of SQL",
        "s.scalars(Memory.__table__.select().where(x))": ".scalars() of SQL",
        "session.query(Memory).all()": "session.query()",
        "ctx.rows(f'SELECT id FROM {t} WHERE x')": "SQL text",
        "helper('UPDATE memories SET a = 1')": "SQL text",
        "x = 'DELETE FROM relations WHERE id = :id'": "SQL text",
    }
    for source, expected in caught.items():
        problems = scan(source)
        assert any(expected in p for p in problems), (source, problems)
    clean = (
        "from sqlalchemy.orm import Session\n"
        "from sqlalchemy.exc import IntegrityError\n"
        "from cpersona.storage.scope import Scope\n"
        "from cpersona.storage.repositories.memories import MemoryRepository\n"
        "def f(app, ids):\n"
        "    with app.db.read() as session:\n"
        "        return MemoryRepository(session, Scope(agent_id='a')).select_by_ids(ids)\n"
        "msg = 'select a file'\n"
        "hint = 'Run deep_check, then update_memory'\n"
        "pool.submit(task)\n"
    )
    assert scan(clean) == []


def test_no_service_module_builds_sql():
    dirty = {
        name: problems
        for name, path in _service_modules().items()
        if (problems := scan(path.read_text(encoding="utf-8")))
    }
    new = {name: problems for name, problems in dirty.items() if name not in NOT_YET_MOVED}
    assert not new, f"service modules that build SQL (move it into cpersona/storage): {new}"


def test_the_not_yet_moved_list_only_shrinks():
    modules = _service_modules()
    missing = sorted(NOT_YET_MOVED - set(modules))
    assert not missing, f"listed modules that no longer exist (drop them from NOT_YET_MOVED): {missing}"
    clean = sorted(name for name in NOT_YET_MOVED if not scan(modules[name].read_text(encoding="utf-8")))
    assert not clean, f"already free of SQL (drop them from NOT_YET_MOVED): {clean}"
