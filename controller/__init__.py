"""HeroServe controller: cluster model, cost model, planners, simulator and control plane."""

from agents import __version__

__all__ = ["__version__"]
