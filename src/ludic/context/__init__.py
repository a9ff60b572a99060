"""Context strategies: how an agent's history becomes the prompt it sends."""

from ludic.context.base import ContextStrategy
from ludic.context.full_dialog import FullDialog
from ludic.context.recent_messages import RecentMessages
from ludic.context.truncated_thinking import TruncatedThinkingContext, strip_thinking

__all__ = ["ContextStrategy", "FullDialog", "RecentMessages", "TruncatedThinkingContext", "strip_thinking"]
