"""Switch agent: the controller's INA assignments to P4Runtime entries (docs/design.md §10).

Run ``heroserve-switch-agent`` (``agents.switch.main``); import ``agents.switch.main``
first in any process that uses these modules, so protobuf runs pure-Python.
"""
