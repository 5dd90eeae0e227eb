"""Config: one YAML file, validated into a frozen model, with errors that name the field.

It imports nothing of lameduck but the drain core's enums (``drain/`` imports nothing of the
project), so every layer may depend on it.
"""

from lameduck.config.durations import Duration, format_duration, parse_duration
from lameduck.config.load import (
    ConfigError,
    default_config,
    format_loc,
    load_config,
    load_config_text,
    parse_config_text,
    strict_yaml_documents,
)
from lameduck.config.schema import (
    AdminConfig,
    ClusterConfig,
    Config,
    Direction,
    DrainConfig,
    DrainType,
    EndpointAddress,
    HostPort,
    ListenAddress,
    ListenerConfig,
    RouteConfig,
    ShutdownConfig,
    StopAccepting,
    Strategy,
)
from lameduck.config.settings import drain_settings

__all__ = [
    "AdminConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "Direction",
    "DrainConfig",
    "DrainType",
    "Duration",
    "EndpointAddress",
    "HostPort",
    "ListenAddress",
    "ListenerConfig",
    "RouteConfig",
    "ShutdownConfig",
    "StopAccepting",
    "Strategy",
    "default_config",
    "drain_settings",
    "format_duration",
    "format_loc",
    "load_config",
    "load_config_text",
    "parse_config_text",
    "parse_duration",
    "strict_yaml_documents",
]
