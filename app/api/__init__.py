"""The HTTP/WebSocket edge: parse, authenticate, call a service, serialise.

May import services, schemas, errors, config, states, db.engine and bus;
never agent, sandbox, llm or worker (the API never talks to Docker or models).
"""
