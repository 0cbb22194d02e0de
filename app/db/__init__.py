"""Postgres: the ORM tables and the engine. The source of truth for everything.

Imported by services and worker; imports only leaves (`errors`, `ids`, `config`, `states`).
"""
