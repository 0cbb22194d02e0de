"""Use cases shared by the API, the worker and the CLI; each one owns its transaction.

May import db, bus, schemas, errors, ids, config and states; never api, worker,
agent, sandbox or llm.
"""
