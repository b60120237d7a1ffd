"""Calibration: measured thresholds, their sidecar file, and recall precision."""
