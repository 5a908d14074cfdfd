"""Python side of the GPU agent (docs/design.md §11): a ctypes binding to the C++ policy core."""

from agents.gpu.policy_core import CoreError, CoreUnavailable, PolicyCore, library_path

__all__ = ["CoreError", "CoreUnavailable", "PolicyCore", "library_path"]
