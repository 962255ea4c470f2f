"""Action adapters: the two action vocabularies computer-use agents are
trained on, translated into ACI steps (one round trip per action, the
screenshot included) with coordinates scaled between the model's resolution
and the sandbox's screen.

- :class:`AnthropicComputer`: Anthropic's computer-use tool (``computer``).
- :class:`OpenAIComputer`: OpenAI's computer-use actions.

Each has ``translate(action)`` (pure: the ACI actions and observation it
would send) and ``async execute(session, action)`` / ``execute_sync``.
"""

from forkfleet.adapters.anthropic import AnthropicComputer, ToolResult
from forkfleet.adapters.openai import OpenAIComputer
from forkfleet.adapters.scaling import Scaler, model_size

__all__ = ["AnthropicComputer", "OpenAIComputer", "ToolResult", "Scaler", "model_size"]
