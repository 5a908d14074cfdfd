"""Reading input files, bounded: :func:`read_text` (a regular file of bounded size, UTF-8),
:func:`parse_json` and :func:`parse_document` (strict JSON, or YAML with duplicate keys,
aliases and deep nesting refused), :func:`read_document` (both).

No message quotes the file's content (docs/inputs.md, "Reading a file"): a file is named by
its path and a place in it (a line, a column), never by a key or text it holds, so a file
read by mistake or on someone else's behalf is not echoed back. ``yaml`` is imported only
when a YAML document is parsed: the switch's and bare installations have no PyYAML
(docs/install.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controller.errors import InputError
from controller.inputs.limits import MAX_DEPTH


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The text of a regular file of at most ``max_bytes`` bytes (UTF-8, BOM allowed). The
    size is checked before reading and again while reading (``/proc`` files lie about it)."""
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(f"{what} file {str(p)!r} does not exist")
        if not p.is_file():
            raise InputError(f"{what} file {str(p)!r} is not a regular file")
        if p.stat().st_size > max_bytes:
            raise InputError(
                f"{p}: {p.stat().st_size} bytes, a {what} file may have at most {max_bytes}"
            )
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(f"{p}: cannot read {what} file ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise InputError(f"{p}: a {what} file may have at most {max_bytes} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text (byte {e.start})") from None


def parse_document(text: str, source: str, yaml_ok: bool) -> Any:
    """JSON (or, with ``yaml_ok``, YAML: JSON is YAML) with duplicate keys, YAML aliases and
    nesting deeper than MAX_DEPTH refused, and non-finite JSON literals left to the schema."""
    if not yaml_ok:
        return parse_json(text, source)
    import yaml

    loader = _loader(yaml)
    _scan_yaml(yaml, loader, text, source)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        raise InputError(f"{source}: not valid YAML{_place(e)}") from None
    except (ValueError, TypeError, RecursionError):  # e.g. an int of 10^5 digits, a bad date
        raise InputError(f"{source}: not valid YAML (a value its type cannot hold)") from None


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def parse_json(text: str, source: str) -> Any:
    """Strict JSON: duplicate keys and nesting beyond the interpreter's recursion refused.
    ``json``'s messages name the problem and a line, never the text."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise InputError(f"{source}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except _DuplicateKey:
        raise InputError(f"{source}: a JSON object names a key twice") from None
    except RecursionError:
        raise InputError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise InputError(f"{source}: not valid JSON (an integer of too many digits)") from None


def _loader(yaml: Any) -> Any:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scan_yaml(yaml: Any, loader: Any, text: str, source: str) -> None:
    """One pass over the YAML events (libyaml's parser is iterative and cheap) before any
    object is built: nesting within MAX_DEPTH, no aliases (a few nested aliases make a
    document of billions of nodes), scalar keys, no duplicate key in a mapping."""
    node_start = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
    node_end = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    # per open collection: [is_mapping, next node is a key, keys seen]
    stack: list[list[Any]] = []
    try:
        for ev in yaml.parse(text, Loader=loader):
            line = f"{source}: line {ev.start_mark.line + 1}"
            if isinstance(ev, yaml.AliasEvent):
                raise InputError(f"{line}: YAML aliases are not supported: write the value out")
            if isinstance(ev, node_start):
                if stack and stack[-1][0]:
                    top = stack[-1]
                    if top[1]:
                        if not isinstance(ev, yaml.ScalarEvent):
                            raise InputError(f"{line}: a mapping key must be a plain string")
                        if ev.value in top[2]:
                            raise InputError(f"{line}: a key the mapping already has")
                        top[2].add(ev.value)
                    top[1] = not top[1]
                if not isinstance(ev, yaml.ScalarEvent):
                    stack.append([isinstance(ev, yaml.MappingStartEvent), True, set()])
                    if len(stack) > MAX_DEPTH:
                        raise InputError(f"{line}: nested deeper than {MAX_DEPTH} levels")
            elif isinstance(ev, node_end):
                stack.pop()
    except yaml.YAMLError as e:
        raise InputError(f"{source}: not valid YAML{_place(e)}") from None


def _place(e: Exception) -> str:
    """Where a YAML error is, as " (line L, column C)": PyYAML's own message quotes the text
    around the error (a snippet, the character or tag it stopped at), so only its mark is
    used."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is None:
        return ""
    return f" (line {mark.line + 1}, column {mark.column + 1})"


def read_document(path: str | Path, what: str, max_bytes: int, max_yaml_bytes: int) -> Any:
    """Read and parse a JSON or YAML file (``.json``: JSON only; ``.yaml``/``.yml``: YAML,
    with the smaller bound ``max_yaml_bytes`` as YAML parses about 50x slower)."""
    p = Path(path)
    is_json = p.suffix.lower() == ".json"
    text = read_text(p, what, max_bytes if is_json else min(max_bytes, max_yaml_bytes))
    return parse_document(text, str(p), yaml_ok=not is_json)
