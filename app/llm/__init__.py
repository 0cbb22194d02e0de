"""Model drivers: `ChatModel` implementations over HTTP, and the scripted stand-in.

Imported by the worker, `sandhive run` and tests. May import `app.agent.types`,
`app.errors`, `app.config`, `app.states`; never storage, bus, services, API or worker.
`app.llm.scripted` (a test and demo server) is imported explicitly, not re-exported.
"""

from app.llm.openai import OpenAIChatModel

__all__ = ["OpenAIChatModel"]
