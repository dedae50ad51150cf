"""YAML a person wrote (the specs, the user's config file), read safely: yaml.SafeLoader that
refuses a key given twice in one mapping (YAML would keep the last silently), a document whose
aliases expand past MAX_VALUES values (YAML's "billion laughs" expands 1 KB into gigabytes), and
a value its explicit tag cannot hold (`!!int x`, `!!timestamp 5:00`, `!!set "text"`), which
PyYAML's constructors raise as ValueError, AttributeError or KeyError. Every problem comes out
as a yaml.YAMLError, with its place where YAML knows it."""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 100_000


class _Loader(yaml.SafeLoader):
    def compose_document(self) -> Any:
        node = super().compose_document()
        sizes: dict[int, int] = {}

        def size(n: Any) -> int:
            # Aliases are the same node object: each is counted where it is used, computed once.
            if id(n) not in sizes:
                sizes[id(n)] = 0   # a recursive alias counts as nothing more
                kids = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else \
                    n.value if isinstance(n, yaml.SequenceNode) else []
                sizes[id(n)] = 1 + sum(size(k) for k in kids)
            return sizes[id(n)]
        if node is not None and size(node) > MAX_VALUES:
            raise yaml.YAMLError(f"its aliases (*name) expand to more than {MAX_VALUES} values: "
                                 "write the values out")
        return node

    # The key whose value is being made, for the words of its error (the value itself is not
    # shown: it may be a secret, an env value).
    _naming: Any = None

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, AttributeError, KeyError):
            what = f"the value of {self._naming}" if self._naming is not None else "this value"
            raise yaml.constructor.ConstructorError(
                None, None, f"{what} is no !!{node.tag.rpartition(':')[2]} value (drop the !!tag or fix the value)",
                node.start_mark) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.YAMLError(f"key {key!r} given twice (lines {seen[key]} and {line}): keep one")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
            if isinstance(value_node, yaml.ScalarNode):   # made (and kept) here, to be named by its key
                self._naming = key
                try:
                    self.construct_object(value_node)
                finally:
                    self._naming = None
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """The document in text; yaml.YAMLError for anything that keeps it from being one."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506  (a SafeLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except (ValueError, TypeError, AttributeError, KeyError):
        # What a tagged collection's constructor raises once the document is built (`!!set` on
        # a list of lists); a scalar's is caught with its place by _Loader.construct_object.
        raise yaml.YAMLError("a value is not of its !!tag's type (drop the !!tags)") from None


def problem(exc: yaml.YAMLError) -> str:
    """One line for a person: where (when YAML knows) and what, without PyYAML's context lines."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
    what = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unreadable"])[0]
    return f"{where}invalid YAML: {what}"
