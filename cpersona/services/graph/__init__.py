"""Declared associations: entities, aliases, mentions, relations, and walking them."""
