"""HeroServe's online scheduler (docs/design.md §8): the Python reference of the C++ policy core."""

from controller.scheduler.online import OnlineScheduler, PolicyTable, TableError, parse_table

__all__ = ["OnlineScheduler", "PolicyTable", "TableError", "parse_table"]
