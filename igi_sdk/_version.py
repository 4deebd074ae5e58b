"""Package and wire-protocol versions."""

__version__ = "0.1.0"
PROTOCOL_VERSION = "1.0"
