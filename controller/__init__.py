"""HeroServe controller: cluster model, cost model, planners, simulator and control plane."""

__version__ = "0.1.0"
