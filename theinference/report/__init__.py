"""Renderers: each turns finished result objects into one output format and computes nothing."""
