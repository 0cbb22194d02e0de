"""Redis: the task queue and per-task live event streams. Never the only copy of anything.

Imported by services and worker; imports only leaves.
"""
