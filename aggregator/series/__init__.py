"""Estimates over time: per-round sufficient statistics, their windows and change detection."""
