import pytest

from ludic.parsers import (
    ParseResult,
    boxed_parser,
    compose_parsers,
    think_prefix_parser,
    xml_parser,
    xml_tag_parser,
)


def test_xml_parser_is_the_same_factory_as_xml_tag_parser():
    assert xml_parser is xml_tag_parser


def test_xml_tag_parser_extracts_the_last_block_with_success_reward():
    parse = xml_tag_parser("move", success_reward=0.1)
    assert parse("I think <move>1</move> no wait <move> 5 </move>") == ParseResult("5", 0.1, None)


def test_xml_tag_parser_failure_says_what_was_expected():
    result = xml_tag_parser("move", error_reward=-0.5)("5")
    assert result.action is None
    assert result.reward == -0.5
    assert (
        result.obs
        == "Invalid format. Expected <move>...</move> in your reply, e.g. <move>your answer</move>."
    )


def test_xml_tag_parser_rejects_empty_content():
    result = xml_tag_parser("answer")("<answer>  </answer>")
    assert result.action is None
    assert result.obs.startswith("Empty <answer></answer> block.")


def test_exact_xml_tag_parser_requires_the_whole_reply_to_be_the_block():
    parse = xml_tag_parser("move", exact=True)
    assert parse("  <move>3</move>\n").action == "3"
    assert parse("Sure: <move>3</move>").action is None
    assert "as your whole reply" in parse("Sure: <move>3</move>").obs


def test_xml_tag_parser_rejects_a_tag_that_is_not_an_xml_name():
    import pytest

    with pytest.raises(ValueError, match="tag must be an XML name"):
        xml_tag_parser("<move>")


def test_think_prefix_parser_returns_the_text_after_think():
    parse = think_prefix_parser(success_reward=0.2)
    assert parse("<think>hmm\nok</think>  B2 ") == ParseResult("B2", 0.2, None)


def test_think_prefix_parser_fails_without_leading_think_block():
    result = think_prefix_parser()("B2 <think>x</think>")
    assert result == ParseResult(
        None,
        -1.0,
        "Invalid format. Expected your reply to start with <think>...</think> followed by your answer.",
    )


def test_think_prefix_parser_fails_when_nothing_follows_think():
    assert think_prefix_parser()("<think>x</think>  ").action is None


def test_boxed_parser_takes_the_last_box_and_keeps_nested_braces():
    parse = boxed_parser()
    assert parse("first \\boxed{1}, finally \\boxed{\\frac{1}{2}}").action == "\\frac{1}{2}"


def test_boxed_parser_fails_on_missing_or_unbalanced_box():
    parse = boxed_parser(error_reward=-2.0)
    assert parse("answer is 4") == ParseResult(
        None, -2.0, "Invalid format. Expected the final answer as \\boxed{...}, e.g. \\boxed{42}."
    )
    assert parse("\\boxed{4").action is None


def test_compose_parsers_chains_actions_and_adds_rewards():
    parse = compose_parsers(
        think_prefix_parser(success_reward=0.1), xml_tag_parser("move", success_reward=0.2)
    )
    result = parse("<think>center</think><move>5</move>")
    assert result.action == "5"
    assert abs(result.reward - 0.3) < 1e-12


def test_compose_parsers_stops_at_first_failure_keeping_rewards_so_far():
    parse = compose_parsers(
        think_prefix_parser(success_reward=0.1), xml_tag_parser("move", error_reward=-1.0)
    )
    result = parse("<think>center</think>5")
    assert result.action is None
    assert abs(result.reward - (-0.9)) < 1e-12
    assert result.obs.startswith("Invalid format. Expected <move>")


def test_xml_tag_parser_matches_tags_case_insensitively():
    assert xml_tag_parser("answer")("<ANSWER>4</Answer>").action == "4"
    assert xml_tag_parser("Answer", exact=True)(" <answer>4</ANSWER> ").action == "4"
    assert xml_tag_parser("answer", exact=True)("<answer>4</answer> tail").action is None


def test_xml_tag_parser_pairs_each_opening_with_the_next_closing_and_keeps_the_last_block():
    parse = xml_tag_parser("a")
    assert parse("<a>1</a> <a>2 <a>3</a> </a>").action == "2 <a>3"
    assert parse("<a>1</a> <a>unclosed").action == "1"


@pytest.mark.parametrize(
    "text",
    [
        "<answer>" * 120_000,  # ~1 MB of unclosed tags: the lazy regex rescanned to the end from each
        "<answer>" + "x" * 1_000_000,
        "</answer><answer>" * 60_000,
        "<" * 1_000_000,
    ],
)
def test_parsers_run_in_linear_time_on_megabyte_adversarial_replies(text):
    import time

    started = time.perf_counter()
    xml_tag_parser("answer")(text)
    xml_tag_parser("answer", exact=True)(text)
    think_prefix_parser()(text)
    boxed_parser()("\\boxed{" + text)
    assert time.perf_counter() - started < 10.0  # linear: well under 1 s at 1 MB; quadratic would take minutes


def test_boxed_parser_fails_when_the_last_box_is_cut_off_rather_than_taking_an_earlier_one():
    # A reply truncated by the token limit: its final answer is unknown, and 12 is what the model replaced.
    result = boxed_parser(error_reward=-2.0)("\\boxed{12} so the answer is \\boxed{1")
    assert result.action is None and result.reward == -2.0
    assert boxed_parser()("\\boxed{12} so the answer is \\boxed{13}").action == "13"
    assert boxed_parser()("\\boxed{1 \\boxed{2}").action == "2"  # the last box closes: its content


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("\\boxed{a\\}b}", "a\\}b"),  # was "a\\": the escaped brace closed the box
        ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),  # was a format error
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{a \\\\}", "a \\\\"),  # \\ is a line break: the brace after it closes
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\}", None),  # was "\\": only an escaped brace, never closed
    ],
)
def test_boxed_parser_reads_latex_escaped_braces_as_content(reply, answer):
    assert boxed_parser()(reply).action == answer


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 100_000,
        "\\boxed{" * 100_000 + "}" * 100_000,
        "\\boxed{" + "{" * 500_000,
        "\\boxed{" + "\\\\" * 500_000,
    ],
)
def test_boxed_parser_is_linear_on_many_openings(text):
    import time

    started = time.perf_counter()
    boxed_parser()(text)
    assert time.perf_counter() - started < 1.0  # about 0.1 s at worst; quadratic would be minutes


def test_think_prefix_parser_matches_the_tag_in_any_case_like_xml_tag_parser():
    parse = think_prefix_parser()
    assert parse("<Think>hmm</Think> B2").action == "B2"  # was a format error
    assert parse("\n<THINK>hmm</think>B2").action == "B2"
    assert parse("<think>a</THINK> b</think> c").action == "b</think> c"  # the first closing ends the block
