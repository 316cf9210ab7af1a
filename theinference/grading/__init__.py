"""Grading, in five rooms; each room imports only the rooms listed before it (tests/test_architecture.py).

  oracle/  the oracle and its caches: the oracles a stage may name (registry), GPT-2 with a named bug
           (bugs), outputs kept for a session (cache) and across runs (store)
  spec/    what a stage file holds (stages), what a case's inputs are (inputs, randomcases), the failure
           shapes a hint may name (shapes)
  judge/   judging one stage: grade (oracle + runner + compare), compare, verification, diagnose,
           fingerprint (with families and loops), scaling, evidence, frames, and the result objects (results)
  drive/   what runs many: the Grader and its Session, batch, watch, progress and advice, copies, threads
  tools/   instructor and student tooling: stages check, mutants, scaffold, export, autograder bundles,
           shard merging, the class view

Uses `model` (the oracle) and `proc` (student processes); never imports `report` or `cli`.
"""
