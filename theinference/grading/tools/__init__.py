"""Instructor and student tooling: `stages check` and its mutants, `stages new`, `oracle` export, autograder
bundles, merging shards, the class view. The top room: it may import every other.
"""
