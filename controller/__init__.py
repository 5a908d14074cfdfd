"""HeroServe controller: cluster model, cost model, planners, simulator and control plane."""

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name == "__version__":  # read when named (agents/__init__.py): help need not pay it
        import agents

        return agents.__version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
