"""Running the agent loop in one process: the episode runner the worker uses, and the
one-process commands built on it (`sandhive run`, `sandhive experiment run --local`).
No Postgres, no Redis, no web: that is what lets those commands run on a laptop.
"""
