"""Model drivers: `ChatModel` implementations over HTTP, and the scripted stand-in.

Imported by the worker, `sandhive run` and tests. May import `app.agent.types`,
`app.errors`, `app.config`, `app.states`; never storage, bus, services, API or worker.
`openai` (chat completions) and `anthropic` (Messages API) are the two wire
formats; `profiles.model_for_profile` picks one by a provider profile's `kind`.
`app.llm.scripted` (a test and demo server, both formats) is imported
explicitly, not re-exported.
"""

from app.llm.anthropic import AnthropicChatModel
from app.llm.openai import OpenAIChatModel

__all__ = ["AnthropicChatModel", "OpenAIChatModel"]
