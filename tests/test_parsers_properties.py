"""Parsers on any model text: a reply never makes a parser raise, and what it accepts is what the reply says.

Invariants (``ludic.parsers``): a result is either a failure (``action`` None, the parser's error reward,
an ``obs`` saying what was expected) or an action that is a non-empty, stripped piece of the reply, taken
by the rule each parser's docstring states; each is checked against a plain reference (a lazy regex, or a walk
over the characters).
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.parsers import ParseResult, boxed_parser, compose_parsers, think_prefix_parser, xml_tag_parser

FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true

# Replies built from the pieces that matter (markers in any case, braces, escaped braces, whitespace) and
# any unicode.
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
        "<THINK>",
        "</Think>",
        "\\boxed{",
        "{",
        "}",
        "\\{",
        "\\}",
        "\\\\",
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
    whole = re.match(r"\s*<think>.*?</think>(.*)", reply, re.IGNORECASE | re.DOTALL)  # tags in any case
    wanted = whole.group(1).strip() if whole else ""
    if _failed(result, -1.0):
        assert not wanted
    else:
        assert _accepted(result, reply, 0.25) == wanted


def _reference_boxed(reply: str) -> str | None:
    """The text after the last ``\\boxed{`` up to the brace closing it, one character at a time; an
    escaped brace or backslash (``\\{``, ``\\}``, ``\\\\``) is two characters of content."""
    start = reply.rfind("\\boxed{")
    if start < 0:
        return None
    begin = j = start + len("\\boxed{")
    depth = 1
    while j < len(reply):
        if reply[j] == "\\" and reply[j + 1 : j + 2] in ("\\", "{", "}"):
            j += 2
            continue
        depth += {"{": 1, "}": -1}.get(reply[j], 0)
        if depth == 0:
            return reply[begin:j]
        j += 1
    return None


@FAST
@given(_replies | _any_text)
def test_boxed_parser_takes_the_content_of_the_last_box_up_to_its_closing_brace(reply: str) -> None:
    result = boxed_parser()(reply)
    wanted = (_reference_boxed(reply) or "").strip()
    if _failed(result, -1.0):
        assert not wanted
    else:
        assert _accepted(result, reply, 0.0) == wanted


# LaTeX answers: balanced groups of commands, escaped braces and line breaks (\\), never a lone backslash.
_latex_atoms = st.sampled_from(["x", "1", " ", "+", "\\frac", "\\{", "\\}", "\\\\", "\\left.", "\\right."])
_latex = st.recursive(
    st.lists(_latex_atoms, max_size=4).map("".join),
    lambda inner: st.lists(inner.map(lambda s: "{" + s + "}") | _latex_atoms, max_size=4).map("".join),
    max_leaves=12,
)
_no_backslash = st.text(st.characters(blacklist_characters="\\"), max_size=8)


@FAST
@given(_replies | _any_text, _latex, _no_backslash)
def test_boxed_parser_reads_a_latex_answer_back_whatever_precedes_it(
    prefix: str, answer: str, suffix: str
) -> None:
    result = boxed_parser()(f"{prefix}\\boxed{{{answer}}}{suffix}")
    assert result.action == (answer.strip() or None)


@FAST
@given(_replies | _any_text, _latex, st.text(st.characters(blacklist_characters="\\}"), max_size=8))
def test_boxed_parser_fails_on_a_reply_cut_off_inside_its_last_box(
    prefix: str, answer: str, cut: str
) -> None:
    # whatever boxes came before: the last answer is unknown, not the one before it
    assert _failed(boxed_parser()(f"{prefix}\\boxed{{{answer}{cut}"), -1.0)


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
