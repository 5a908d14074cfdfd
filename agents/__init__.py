"""HeroServe agents: the switch agent (P4Runtime) and the Python side of the GPU agent."""
