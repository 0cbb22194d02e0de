"""Operators' use cases: the figures of `/metrics`, workers and their slots, drain, requeue,
fail, prune.
"""
