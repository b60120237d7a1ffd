"""The per-process services of an App: typed attributes, built once, on first use, in one place.

(issue 18 part 3: ``App.extras`` was an untyped dict every service module
wrote its own key into.) The rules hold for every service App declares.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

import pytest

from cpersona.services.app import App, OnFirstUse

SERVICES = sorted(name for name, value in vars(App).items() if isinstance(value, OnFirstUse))


def test_every_service_is_declared_on_app_and_nothing_else_holds_them():
    assert len(SERVICES) >= 12, SERVICES
    assert not hasattr(App, "extras")
    assert "extras" not in {f.name for f in dataclasses.fields(App)}


@pytest.mark.parametrize("name", SERVICES)
def test_a_service_is_built_once_and_shared_by_the_apps_copies(app, name):
    """The pause gate runs a paused read on dataclasses.replace(app, writes_paused=True):
    the copy must reach the same queue, pause map, calibration ... (spec P-12 relies on it)."""
    descriptor: OnFirstUse = vars(App)[name]
    assert descriptor.if_built(app) is None  # reading whether it exists builds nothing
    first = getattr(app, name)
    assert getattr(app, name) is first
    quiet = dataclasses.replace(app, writes_paused=True)
    assert getattr(quiet, name) is first
    if first is not None:
        assert descriptor.if_built(quiet) is first


@pytest.mark.parametrize("name", SERVICES)
def test_concurrent_first_reads_build_one_service(app, name):
    seen: list[object] = []
    start = threading.Barrier(8)

    def read() -> None:
        start.wait()
        seen.append(getattr(app, name))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == 8 and all(s is seen[0] for s in seen)


def test_assigning_a_service_replaces_it(app):
    from cpersona.services.calibration.state import CalibrationState

    mine = CalibrationState(seed=1)
    app.calibration = mine
    assert app.calibration is mine and App.calibration.if_built(app) is mine


def test_an_app_imports_no_service_package_until_a_service_is_read(db_path):
    """Start-up stays cheap: building an App loads none of the modules behind its services."""
    probe = f"""
import sys
from cpersona.config import load_settings
from cpersona.services.app import App
from cpersona.storage.engine import open_sqlite
app = App(db=open_sqlite({str(db_path)!r}), settings=load_settings({{}}))
loaded = sorted(m for m in sys.modules if m.startswith(("cpersona.services.", "cpersona.embedding.")))
assert loaded == ["cpersona.services.app"], loaded
app.pause_buckets
assert "cpersona.services.operations.pause" in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
