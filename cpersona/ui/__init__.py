"""``cpersona ui``: a local web page over the memory database (search, timeline, records, graph, health, charts).

Importing this package loads nothing heavy: :mod:`cpersona.ui.cli` registers
the subcommand with argparse only; the web stack is imported when it runs.
"""
