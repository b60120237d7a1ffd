"""Stop the HTTP server after a quiet period (``CPERSONA_HTTP_IDLE_EXIT_SECONDS``).

For a server started by ``cpersona proxy --spawn``: every proxy pings it while
its session lives, so a period with no request at all means no proxy is left.
The stop is a SIGINT to this process, the same path as Ctrl-C: uvicorn stops
serving, then the server closes the database as on any other shutdown.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)


class IdleExit:
    """ASGI wrapper counting requests; a watcher thread stops the process when none came for ``seconds``."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds
        self.active = 0
        self.last = time.monotonic()
        threading.Thread(target=self._watch, name="cpersona-idle-exit", daemon=True).start()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
            self.last = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.seconds / 4))
            if self.active == 0 and time.monotonic() - self.last >= self.seconds:
                log.info("no request for %.0f s: stopping (CPERSONA_HTTP_IDLE_EXIT_SECONDS)", self.seconds)
                os.kill(os.getpid(), signal.SIGINT)
                return
