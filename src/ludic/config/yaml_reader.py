"""YAML run configs read safely: no alias bombs, no silently repeated keys, no stack overflow.

``yaml.safe_load`` keeps the last of two equal keys (``model:`` twice takes the second table and
drops the first without a word); TOML refuses them, and so does this reader, naming the key and
both lines. YAML merge keys (``<<: *base``) still work: a key written out overrides a merged one.
"""

from __future__ import annotations

import functools
from typing import Any

from ludic.config.errors import ConfigError
from ludic.config.limits import MAX_CONFIG_DEPTH, depth_error

MAX_CONFIG_NODES = 100_000
"""Values a YAML file may expand to once its aliases are followed (an alias bomb expands to billions)."""


def yaml_load(text: str, name: str) -> Any:
    """``yaml.safe_load`` refusing duplicate keys, aliases that expand past ``MAX_CONFIG_NODES`` and
    nesting past ``MAX_CONFIG_DEPTH`` (checked on the parser's events, before the recursive composer)."""
    _check_event_depth(text, name)
    loader = _strict_loader()(text)
    loader.file_name = name
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        expanded = _expanded_size(node, {})
        if expanded > MAX_CONFIG_NODES:
            raise ConfigError(
                [f"{name}: expands to more than {MAX_CONFIG_NODES} values through YAML aliases "
                 "(an alias bomb?); write the values out"]
            )  # fmt: skip
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    """Values in ``node`` with every alias followed; shared nodes are sized once (memo), so this is fast."""
    key = id(node)
    if key not in memo:
        memo[key] = 1  # a recursive alias counts once instead of looping
        value = node.value
        if isinstance(value, list):
            children = [c for item in value for c in (item if isinstance(item, tuple) else (item,))]
            memo[key] = 1 + sum(min(_expanded_size(c, memo), MAX_CONFIG_NODES + 1) for c in children)
    return memo[key]


def _check_event_depth(text: str, name: str) -> None:
    """Depth from the (iterative) event stream, tracking the key of each open mapping for the message."""
    import yaml

    stack: list[list[Any]] = []  # per open container: [is_mapping, next_node_is_key, current_key]
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()
            _node_done(stack)
        elif isinstance(
            event, (yaml.MappingStartEvent, yaml.SequenceStartEvent, yaml.ScalarEvent, yaml.AliasEvent)
        ):
            parent = stack[-1] if stack else None
            if parent is not None and parent[0] and parent[1]:
                parent[2] = event.value if isinstance(event, yaml.ScalarEvent) else "?"
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                _node_done(stack)
            elif len(stack) > MAX_CONFIG_DEPTH:
                keys = [str(frame[2]) for frame in stack if frame[0]]
                raise depth_error(name, keys, line=event.start_mark.line + 1)
            else:
                stack.append([isinstance(event, yaml.MappingStartEvent), True, None])


def _node_done(stack: list[list[Any]]) -> None:
    """A key or value finished: the enclosing mapping now expects the other one."""
    if stack and stack[-1][0]:
        stack[-1][1] = not stack[-1][1]


@functools.cache
def _strict_loader() -> type:
    """A ``SafeLoader`` whose mappings refuse a key written twice (built lazily: yaml is imported late)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        file_name = "<yaml>"

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                self._refuse_duplicate_keys(node)
            return super().construct_mapping(node, deep=deep)

        def _refuse_duplicate_keys(self, node: Any) -> None:
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merge keys may repeat; complex keys are refused later (not JSON)
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise ConfigError(
                        [f"{self.file_name}: key {key!r} appears twice in one table (line {first_line[key]} "
                         f"and line {line}); YAML would silently keep the second: remove one"]
                    )  # fmt: skip
                first_line[key] = line

    return StrictLoader
