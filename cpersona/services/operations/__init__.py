"""Server-wide state and upkeep: the no-persist pause, queued tasks, install and update checks."""
