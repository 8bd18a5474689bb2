"""Simulation: synthetic data, fleets, experiments and the command line."""
