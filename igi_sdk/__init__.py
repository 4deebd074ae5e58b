"""IGI SDK: in-game LLM inference under a VRAM budget."""
from igi_sdk._version import PROTOCOL_VERSION, __version__

__all__ = ["PROTOCOL_VERSION", "__version__"]
