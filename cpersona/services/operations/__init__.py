"""Server-wide state and upkeep: the persistence pause, queued tasks, install and update checks."""
