"""Memory, episode and profile rows: storing, editing, listing, expanding, derived data."""
