"""What the real-tokenizer tests share: SmolLM2's tokenizer folder, a reply sampled as non-canonical ids,
and a client that replies with chosen ids."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ludic.inference.request import ChatCompletionRequest
from ludic.types import ChatResponse

TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_tokenizer"
NEWLINE, EOS = 198, 2  # "\n" (the generation prompt's last token) and "<|im_end|>"
HELLO_WORLD = [11653, 5365, 458, 400]
"""``"Hel" "lo" " wor" "ld"``: a reply whose text, "Hello world", re-encodes as ``HELLO_WORLD_CANONICAL``."""
HELLO_WORLD_CANONICAL = [19556, 905]
SUCCESSORS = {NEWLINE: HELLO_WORLD[0], **dict(zip(HELLO_WORLD, [*HELLO_WORLD[1:], EOS], strict=True))}
"""After every generation prompt the successor model samples ``HELLO_WORLD`` and then ends its turn."""


class ScriptedIdsClient:
    """Replies with chosen completion ids (decoded with the real tokenizer), for the loop around a model.

    Each request is kept in ``requests``; prompt ids are the request's ``prompt_token_ids``.
    """

    def __init__(self, tokenizer: Any, replies: Sequence[list[int]], logprob: float = -0.25) -> None:
        self.tokenizer, self.replies, self.logprob = tokenizer, list(replies), logprob
        self.requests: list[ChatCompletionRequest] = []

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        if request.prompt_token_ids is None:
            raise ValueError("ScriptedIdsClient needs token-in requests (an agent with a tokenizer)")
        ids = self.replies[len(self.requests)]
        self.requests.append(request)
        response = ChatResponse(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason="stop",
            prompt_token_ids=list(request.prompt_token_ids),
            completion_token_ids=list(ids),
            completion_logprobs=[self.logprob] * len(ids),
            policy_version=0,
        )
        return response, {"policy_version": 0}


def split_ids(tokenizer: Any, text: str) -> list[int]:
    """``text``'s canonical ids with its first splittable token split in two: the same text, other ids."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    for k, tok in enumerate(ids):
        piece = tokenizer.decode([tok])
        for cut in range(1, len(piece)):
            left = tokenizer.encode(piece[:cut], add_special_tokens=False)
            right = tokenizer.encode(piece[cut:], add_special_tokens=False)
            if len(left) == len(right) == 1:
                split = [*ids[:k], *left, *right, *ids[k + 1 :]]
                if tokenizer.decode(split) == text and tokenizer.encode(text, add_special_tokens=False) != split:
                    return split
    raise ValueError(f"no token of {text!r} splits into two tokens")
