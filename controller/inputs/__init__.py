"""What a valid input is, in one place (docs/inputs.md):

- ``schema``: the checking vocabulary (records, lists, numbers, strings) with one-line errors
  naming the offending item;
- ``documents``: bounded reading of JSON/YAML files, whose messages never quote the file;
- ``limits``: every bound an input is held to (sizes, counts, ranges);
- ``plan_checks``: the plan file's schema, derived from the dataclasses of
  ``controller/plan.py``, and the checks of a plan on its own and against a cluster;
- ``args``: argparse types with bounds and the parser whose errors are one line.
"""
