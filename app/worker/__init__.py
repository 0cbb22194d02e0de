"""The worker process: takes tasks from Redis, runs each in its own sandbox, records everything.

May import services, episode, agent, sandbox, llm, bus, db, schemas; never the API.
"""
