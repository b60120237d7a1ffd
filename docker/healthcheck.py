"""The image's HEALTHCHECK: alive when the HTTP transport answers at all.

Any HTTP status below 500 counts (an unauthenticated GET is answered 401): the
check needs no token, so the token never appears in `docker inspect`.
"""

import os
import sys
import urllib.error
import urllib.request

url = f"http://127.0.0.1:{os.environ.get('CPERSONA_HTTP_PORT', '8402')}/mcp"
try:
    urllib.request.urlopen(url, timeout=4)
except urllib.error.HTTPError as answer:
    sys.exit(0 if answer.code < 500 else 1)
except OSError:
    sys.exit(1)
