"""Grading: stages, the oracle registry, comparison, diagnosis and fingerprinting, batch and watch drivers.

Uses `model` (the oracle) and `proc` (student processes); never imports `report` or `cli`.
"""
