"""Parsers on any model text: a reply never makes a parser raise, and what it accepts is what the reply says.

Invariants (``ludic.parsers``): a result is either a failure (``action`` None, the parser's error reward,
an ``obs`` saying what was expected) or an action that is a non-empty, stripped piece of the reply, taken
by the rule each parser's docstring states; each is checked against a plain reference (a lazy regex).
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.parsers import ParseResult, boxed_parser, compose_parsers, think_prefix_parser, xml_tag_parser

FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 1000 under CI=true

# Replies built from the pieces that matter (markers in any case, braces, whitespace) and any unicode.
_pieces = st.sampled_from(
    [
        "<a>",
        "</a>",
        "<A>",
        "</A>",
        "<a",
        "a>",
        "</",
        "<think>",
        "</think>",
        "\\boxed{",
        "{",
        "}",
        " ",
        "\n",
        "x",
        "1",
    ]
)
_replies = st.lists(_pieces | st.text(max_size=4), max_size=14).map("".join)
_any_text = st.text(max_size=200)  # includes surrogates, control characters and the empty string
_block_pieces = _pieces.filter(lambda p: p.lower() not in ("<a>", "</a>", "<a", "a>"))  # pieces of no marker
_blocks = st.lists(_block_pieces | st.text("xy1 \n\t{}", max_size=3), max_size=5)


def _failed(result: ParseResult, error_reward: float) -> bool:
    """A failure is exactly: no action, the error reward, and a feedback text."""
    if result.action is not None:
        return False
    assert result.reward == error_reward and isinstance(result.obs, str) and result.obs
    return True


def _accepted(result: ParseResult, reply: str, success_reward: float) -> str:
    assert result.reward == success_reward and result.obs is None
    assert isinstance(result.action, str) and result.action and result.action == result.action.strip()
    assert result.action in reply
    return result.action


@FAST
@given(_replies | _any_text)
def test_xml_tag_parser_takes_the_last_block_a_lazy_regex_would_pair(reply: str) -> None:
    result = xml_tag_parser("a", success_reward=0.5, error_reward=-0.5)(reply)
    blocks = re.findall(r"<a>(.*?)</a>", reply, re.IGNORECASE | re.DOTALL)
    wanted = blocks[-1].strip() if blocks else ""
    if _failed(result, -0.5):
        assert not wanted
    else:
        assert _accepted(result, reply, 0.5) == wanted


@FAST
@given(_replies | _any_text)
def test_exact_xml_tag_parser_accepts_only_a_reply_that_is_one_block(reply: str) -> None:
    result = xml_tag_parser("a", exact=True)(reply)
    whole = re.match(r"<a>(.*?)</a>", reply.strip(), re.IGNORECASE | re.DOTALL)
    one_block = whole is not None and whole.end() == len(reply.strip())
    if _failed(result, -1.0):
        assert not one_block or not whole.group(1).strip()
    else:
        assert one_block and _accepted(result, reply, 0.0) == whole.group(1).strip()


@FAST
@given(_blocks.map("".join), _blocks.map("".join), st.text(" \n\t", max_size=3))
def test_exact_xml_tag_parser_refuses_two_blocks_and_reads_one_back(
    first: str, second: str, pad: str
) -> None:
    parse = xml_tag_parser("a", exact=True)
    assert parse(f"{pad}<a>{first}</a>{pad}<a>{second}</a>{pad}").action is None  # was: "first</a><a>second"
    assert parse(f"{pad}<a>{first}</a>{pad}").action == (first.strip() or None)


@FAST
@given(_replies | _any_text)
def test_think_prefix_parser_answers_with_what_follows_the_first_closing_think(reply: str) -> None:
    result = think_prefix_parser(success_reward=0.25)(reply)
    head = reply.lstrip()
    closing = head.find("</think>")
    wanted = head[closing + len("</think>") :].strip() if head.startswith("<think>") and closing >= 7 else ""
    if _failed(result, -1.0):
        assert not wanted
    else:
        assert _accepted(result, reply, 0.25) == wanted


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


@FAST
@given(_replies | _any_text)
def test_boxed_parser_takes_the_balanced_content_of_the_last_box(reply: str) -> None:
    result = boxed_parser()(reply)
    if _failed(result, -1.0):
        return
    action = _accepted(result, reply, 0.0)
    start = reply.rfind("\\boxed{") + len("\\boxed{")
    content = reply[start:]
    end = next(i for i in range(len(content) + 1) if _balanced(content[:i]) and content[i : i + 1] == "}")
    assert _balanced(action) and content[:end].strip() == action


@FAST
@given(_replies | _any_text, st.booleans())
def test_composed_parsers_add_rewards_and_stop_at_the_first_failure(reply: str, exact: bool) -> None:
    think, move = think_prefix_parser(0.25, -1.0), xml_tag_parser("a", exact=exact, success_reward=0.5)
    first = think(reply)
    result = compose_parsers(think, move)(reply)
    if first.action is None:
        assert result == first
    else:
        second = move(first.action)
        assert result == ParseResult(second.action, first.reward + second.reward, second.obs)
