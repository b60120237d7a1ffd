"""``python tests/stdio_sdk_server.py``: the server with the SDK's own stdio session, for comparisons.

The default stdio start serves on cpersona.mcp.stdio_session (the SDK's wire
types only); this runs the same start on the SDK's ``Server.run`` instead, so a
test can send both the same lines and compare the answers byte for byte.
"""

import sys

from cpersona import cli

cli.STDIO_SESSION = "sdk"
raise SystemExit(cli.main(sys.argv[1:]))
