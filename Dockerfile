# cpersona over streamable HTTP, one database on a volume, run as a non-root user.
#
#   docker build -t cpersona-server .
#   docker run -d --name cpersona -p 127.0.0.1:8402:8402 -v cpersona-data:/data \
#       -e CPERSONA_AUTH_TOKEN="$(openssl rand -hex 32)" cpersona-server
#
# The token comes from the environment at run time and is never baked into the
# image; without it (or CPERSONA_ACL_FILE) the server refuses to start. See
# docs/operations.md, "Docker". BASE may name any Debian-like image with
# python3 (3.11+) and its venv module.
ARG BASE=python:3.12-slim

FROM ${BASE} AS build
# Extras to install, e.g. --build-arg EXTRAS="[local,postgres]" (local embeddings, PostgreSQL).
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY cpersona ./cpersona
COPY migrations ./migrations
RUN python3 -m venv /opt/cpersona \
 && /opt/cpersona/bin/pip install --no-cache-dir --disable-pip-version-check ".${EXTRAS}"

FROM ${BASE}
COPY --from=build /opt/cpersona /opt/cpersona
COPY docker/healthcheck.py /opt/cpersona/healthcheck.py
# A fixed uid so a bind-mounted host folder can be given to it: chown 10001 <folder>.
RUN useradd --system --uid 10001 --user-group --home-dir /data --no-create-home --shell /usr/sbin/nologin cpersona \
 && mkdir -p /data && chown cpersona:cpersona /data && chmod 0700 /data
# /data holds the database and everything that sits beside it (WAL, calibration
# sidecar, update-check cache), and $HOME's ~/.cache (a local embedding model).
ENV PATH=/opt/cpersona/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CPERSONA_TRANSPORT=streamable-http \
    CPERSONA_HTTP_HOST=0.0.0.0 \
    CPERSONA_HTTP_PORT=8402 \
    CPERSONA_DB_PATH=/data/cpersona.db
VOLUME ["/data"]
USER cpersona
WORKDIR /data
EXPOSE 8402
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/cpersona/bin/python", "/opt/cpersona/healthcheck.py"]
ENTRYPOINT ["cpersona"]
