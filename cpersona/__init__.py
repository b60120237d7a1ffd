"""cpersona: a persistent-memory server for LLM agents, spoken to over MCP."""

__version__ = "0.1.0"

# Our name on PyPI. `cpersona` there is CPersona 2.6, a different program, so everything that
# looks up our releases, our installed metadata or offers an install command names this instead
# (README "Install"). The version line is our own (0.x), never the reference's 2.6.x.
DISTRIBUTION = "cpersona-server"
