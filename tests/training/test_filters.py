"""Sample filters return True to keep a sample; combine keeps only what every filter keeps."""

from ludic.training.filters import combine, drop_incomplete_completions, drop_parse_errors, drop_truncated
from ludic.training.types import SAWItem


def _item(**meta) -> SAWItem:
    return SAWItem([1, 2], [1, 1], [0, 1], 1.0, meta)


def test_each_filter_drops_its_case():
    assert drop_truncated()(_item(truncated=False)) and not drop_truncated()(_item(truncated=True))
    assert not drop_truncated()(_item(episode_truncated=True))
    assert drop_incomplete_completions()(_item(finish_reason="stop"))
    assert not drop_incomplete_completions()(_item(finish_reason="length"))
    assert drop_parse_errors()(_item(parse_error=False)) and not drop_parse_errors()(_item(parse_error=True))


def test_combine_requires_every_filter():
    keep = combine(drop_parse_errors(), drop_incomplete_completions())
    assert keep(_item(parse_error=False, finish_reason="stop"))
    assert not keep(_item(parse_error=False, finish_reason="length"))
    assert not keep(_item(parse_error=True, finish_reason="stop"))
