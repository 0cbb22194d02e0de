"""Model drivers: `ChatModel` implementations over HTTP.

Imported by the worker, `sandhive run` and tests. May import `app.agent.types`,
`app.errors`, `app.config`, `app.states`; never storage, bus, services, API or worker.
`openai` (chat completions) and `anthropic` (Messages API) are the two wire
formats; `profiles.model_for_profile` picks one by a provider profile's `kind`.
The scripted stand-in for tests and the demo is `app.scripted`, a package of
its own that nothing here imports.
"""

from app.llm.anthropic import AnthropicChatModel
from app.llm.openai import OpenAIChatModel

__all__ = ["AnthropicChatModel", "OpenAIChatModel"]
