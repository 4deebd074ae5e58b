"""Edge: measure this machine (through llama.cpp and numpy) into a planner ``Profile``, cached per machine."""

from igi_sdk.profiler.store import load_or_create_profile, load_profile, profile_path, save_profile

__all__ = ["load_or_create_profile", "load_profile", "profile_path", "save_profile"]
