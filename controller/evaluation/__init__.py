"""The paper's evaluation (§V, Fig. 7-10) on the project's cluster model and simulator:
scenarios, sweeps over a process pool or Ray, CSV and PNG output (docs/design.md §7)."""
