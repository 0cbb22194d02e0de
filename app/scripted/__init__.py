"""A scripted model server for the demo and the tests: fixed tool calls, both wire formats.

A real HTTP server (`ScriptedLLMServer`) that answers OpenAI's chat completions
and Anthropic's Messages API by playing a `Script` of `Turn`s; used in place of
a paid model by `sandhive demo`, the tests and `bench/`. Production code never
imports it (an import-linter contract); `app.cli.main` does, for the demo and the profile.
`script` holds the shared model, `openai` and `anthropic` the two faces,
`stream` their Server-Sent Events, `server` the app and its thread, `demo`
the demo's task, `profile` the opt-in `scripted` LLM profile (`SANDHIVE_SCRIPTED_PROFILE`),
served in-process by `sandhive worker` and `sandhive run`.
"""

from app.scripted.demo import DEMO_ANSWER, DEMO_MODEL, DEMO_PROMPT, DEMO_SCRIPT
from app.scripted.script import EXHAUSTED, Script, Turn, prompt_tokens_of
from app.scripted.server import ScriptedLLMServer

__all__ = [
    "DEMO_ANSWER",
    "DEMO_MODEL",
    "DEMO_PROMPT",
    "DEMO_SCRIPT",
    "EXHAUSTED",
    "Script",
    "ScriptedLLMServer",
    "Turn",
    "prompt_tokens_of",
]
