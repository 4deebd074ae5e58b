"""Package and wire-protocol versions."""

__version__ = "0.1.0"
PROTOCOL_VERSION = "1.4"
#: Every protocol version this package speaks (one major; a minor adds only optional fields and types).
SUPPORTED_PROTOCOL_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
