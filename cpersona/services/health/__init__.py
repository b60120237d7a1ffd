"""Health checks: the registry, check_health, deep_check, the findings pull (spec health.md)."""
