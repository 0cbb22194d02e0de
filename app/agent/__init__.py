"""The paper's agent loop and its three tools; knows nothing of Postgres, Redis, HTTP or Docker.

It reaches the outside only through the Protocols of `agent.types`, which is what
lets `sandhive run` and the worker share one loop.
"""
