"""Reading config files into a `Config`, with errors an operator can act on.

Every problem becomes one line `FILE: dotted.path[0].field: what is wrong`, so a bad deploy fails
with the field to fix instead of a pydantic dump or a traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import types
import typing
from collections.abc import Hashable, Iterable, Sequence
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from lameduck.config.schema import Config, drain_warnings, partial_problems, shutdown_warnings

__all__ = [
    "ConfigError",
    "default_config",
    "format_loc",
    "load_config",
    "load_config_text",
    "parse_config_text",
    "strict_yaml_documents",
]

log = logging.getLogger("lameduck.config")

# Error types whose message does not already show the offending value.
_NO_INPUT_ECHO = frozenset({"missing", "extra_forbidden", "value_error", "config_rule"})


class ConfigError(Exception):
    """A config that cannot be used; str() is one `SOURCE: path: problem` line per problem."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)  # (field path, message)
        super().__init__(
            "\n".join(
                f"{source}: {path}: {message}" if path else f"{source}: {message}"
                for path, message in self.problems
            )
        )

    @classmethod
    def from_validation_error(cls, error: ValidationError, source: str) -> ConfigError:
        """Turn pydantic's errors into path/message pairs (also for configs built in code)."""
        return cls(source, [(format_loc(e["loc"]), _message(e)) for e in error.errors()])


def format_loc(loc: Iterable[int | str]) -> str:
    """("listeners", 0, "address") -> "listeners[0].address"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(error["loc"][:-1])
        return f"unknown key (allowed: {allowed})" if allowed else "unknown key"
    message = error["msg"]
    value = error.get("input")
    if kind not in _NO_INPUT_ECHO and isinstance(value, str | int | float | bool | None):
        message = f"{message} (got {value!r})"
    return message


def _allowed_keys(loc: tuple[int | str, ...]) -> str:
    """Walk the model tree along `loc` to list the keys valid where an unknown one appeared."""
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return ""
        found = _model_in(field.annotation)
        if found is None:
            return ""
        model = found
    return ", ".join(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (tuple, list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys: PyYAML would silently keep the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "unhashable key",
                key_node.start_mark,
            )
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _yaml_error(source: str, error: yaml.YAMLError) -> ConfigError:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return ConfigError(source, [(where, f"invalid YAML: {problem}")])


def strict_yaml_documents(text: str) -> list[Any]:
    """Every document of YAML text, parsed as configs are: safely, a duplicate key an error
    (``yaml.YAMLError``) instead of PyYAML silently keeping the last one."""
    return list(yaml.load_all(text, Loader=_StrictLoader))  # a SafeLoader subclass


def parse_config_text(text: str, source: str = "<string>") -> dict[str, Any]:
    """YAML config text as its mapping of sections, not yet validated: parsed strictly (a
    duplicate key is refused) and checked to be a mapping, as `load_config_text` does."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as error:
        raise _yaml_error(source, error) from None
    if data is None:
        raise ConfigError(source, [("", "config is empty (expected a mapping of sections)")])
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            [("", f"top level must be a mapping of sections, got {type(data).__name__}")],
        )
    return data


def load_config_text(text: str, source: str = "<string>") -> Config:
    """Parse and validate YAML text; `source` names it in error messages."""
    data = parse_config_text(text, source)
    try:
        config = Config.model_validate(data)
    except ValidationError as error:
        found = ConfigError.from_validation_error(error, source).problems
        # and the cross-section rules pydantic left unchecked (it runs them on a valid tree
        # only): every problem in one run, not one stage per run
        said = {path for path, _ in found}
        more = [(path, message) for path, message in
                ((format_loc(loc), message) for loc, message, _ in partial_problems(data))
                if path not in said]
        raise ConfigError(source, [*found, *more]) from None
    # Valid but probably not meant: said on every load (run, supervise, validate, budget).
    for path, message in [*drain_warnings(config.drain),
                          *shutdown_warnings(config.shutdown, config.drain)]:
        log.warning("%s: %s: %s", source, path, message)
    return config


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML config file; any problem (even a missing file) is a ConfigError."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError as error:
        raise ConfigError(source, [("", f"cannot read: {error.strerror or error}")]) from None
    except UnicodeDecodeError as error:
        raise ConfigError(source, [("", f"not UTF-8 text: {error.reason}")]) from None
    return load_config_text(text, source)


@functools.cache
def default_config() -> Config:
    """The packaged default.yaml, what `lameduck run` uses without a file (Config is frozen)."""
    text = resources.files("lameduck.config").joinpath("default.yaml").read_text(encoding="utf-8")
    return load_config_text(text, "<default.yaml>")
