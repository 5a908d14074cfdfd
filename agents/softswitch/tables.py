"""Match-action tables, indirect counters, registers and the packet replication engine
of the executable model, with the error classes the P4Runtime server maps to gRPC codes.

Only what p4/heroserve_ina.p4 uses is modelled: exact-match tables, packet or
packets-and-bytes indirect counters, bit<W> registers, multicast groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ModelError(Exception):
    """A control-plane request the model refuses; ``code`` names the gRPC status."""

    code = "UNKNOWN"


class InvalidArgument(ModelError):
    code = "INVALID_ARGUMENT"


class NotFound(ModelError):
    code = "NOT_FOUND"


class AlreadyExists(ModelError):
    code = "ALREADY_EXISTS"


class OutOfRange(ModelError):
    code = "OUT_OF_RANGE"


class ResourceExhausted(ModelError):
    code = "RESOURCE_EXHAUSTED"


class Unimplemented(ModelError):
    code = "UNIMPLEMENTED"


@dataclass(frozen=True)
class ActionSpec:
    """An action's name and its parameters as (name, bitwidth) pairs."""

    name: str
    params: tuple[tuple[str, int], ...] = ()
    default_only: bool = False


@dataclass
class TableEntry:
    """One exact-match entry: key values in match-field order, action and its arguments."""

    key: tuple[int, ...]
    action: str
    params: dict[str, int] = field(default_factory=dict)


class ExactTable:
    """An exact-match table. Subclasses fix NAME, KEY, ACTIONS, DEFAULT_ACTION and SIZE."""

    NAME: str = ""
    KEY: tuple[tuple[str, int], ...] = ()
    ACTIONS: tuple[ActionSpec, ...] = ()
    DEFAULT_ACTION: str = "NoAction"
    CONST_DEFAULT: bool = True
    SIZE: int = 1024

    def __init__(self) -> None:
        self.entries: dict[tuple[int, ...], TableEntry] = {}
        self.actions = {a.name: a for a in self.ACTIONS}
        self.default = TableEntry(key=(), action=self.DEFAULT_ACTION, params={})

    def _check_entry(self, entry: TableEntry) -> None:
        if len(entry.key) != len(self.KEY):
            raise InvalidArgument(f"{self.NAME}: key needs {len(self.KEY)} fields")
        for value, (name, width) in zip(entry.key, self.KEY, strict=True):
            if not 0 <= value < (1 << width):
                raise InvalidArgument(f"{self.NAME}: {name}={value} exceeds {width} bits")
        spec = self.actions.get(entry.action)
        if spec is None:
            raise InvalidArgument(f"{self.NAME}: action {entry.action} not in this table")
        if spec.default_only:
            raise InvalidArgument(f"{self.NAME}: action {entry.action} is default-only")
        self._check_params(spec, entry.params)

    def _check_params(self, spec: ActionSpec, params: dict[str, int]) -> None:
        names = {n for n, _ in spec.params}
        if set(params) != names:
            raise InvalidArgument(
                f"{self.NAME}: action {spec.name} takes {sorted(names)}, got {sorted(params)}"
            )
        for name, width in spec.params:
            if not 0 <= params[name] < (1 << width):
                raise InvalidArgument(
                    f"{self.NAME}: {spec.name}.{name}={params[name]} exceeds {width} bits"
                )

    def insert(self, entry: TableEntry) -> None:
        """Add an entry; ALREADY_EXISTS when the key is taken, RESOURCE_EXHAUSTED when full."""
        self._check_entry(entry)
        if entry.key in self.entries:
            raise AlreadyExists(f"{self.NAME}: entry {entry.key} exists")
        if len(self.entries) >= self.SIZE:
            raise ResourceExhausted(f"{self.NAME}: table full ({self.SIZE} entries)")
        self.entries[entry.key] = entry

    def modify(self, entry: TableEntry) -> None:
        """Replace the action of an existing entry; NOT_FOUND when absent."""
        self._check_entry(entry)
        if entry.key not in self.entries:
            raise NotFound(f"{self.NAME}: no entry {entry.key}")
        self.entries[entry.key] = entry

    def delete(self, key: tuple[int, ...]) -> None:
        """Remove an entry; NOT_FOUND when absent."""
        if key not in self.entries:
            raise NotFound(f"{self.NAME}: no entry {key}")
        del self.entries[key]

    def set_default(self, action: str, params: dict[str, int]) -> None:
        """Change the default action (refused for ``const default_action``)."""
        if self.CONST_DEFAULT:
            raise InvalidArgument(f"{self.NAME}: default action is const")
        spec = self.actions.get(action)
        if spec is None:
            raise InvalidArgument(f"{self.NAME}: action {action} not in this table")
        self._check_params(spec, params)
        self.default = TableEntry(key=(), action=action, params=dict(params))

    def reset_default(self) -> None:
        """Back to the program's default action."""
        self.default = TableEntry(key=(), action=self.DEFAULT_ACTION, params={})

    def lookup(self, key: tuple[int, ...]) -> TableEntry | None:
        """The entry for ``key`` (a hit), or None (a miss: the caller runs the default)."""
        return self.entries.get(key)


class IndirectCounter:
    """``counter(size, type)``: per-index packet and byte counts (bytes = frame length)."""

    def __init__(self, name: str, size: int, unit: str) -> None:
        self.name = name
        self.size = size
        self.unit = unit  # "PACKETS", "BYTES" or "BOTH"
        self.packets = [0] * size
        self.bytes = [0] * size

    def count(self, index: int, nbytes: int) -> None:
        """Add one packet of ``nbytes``; BMv2 ignores out-of-range indices, so does this."""
        if 0 <= index < self.size:
            self.packets[index] += 1
            self.bytes[index] += nbytes

    def write(self, index: int, packets: int, nbytes: int) -> None:
        """Set one cell (P4Runtime MODIFY of a CounterEntry)."""
        if not 0 <= index < self.size:
            raise OutOfRange(f"{self.name}: index {index} >= size {self.size}")
        self.packets[index] = packets
        self.bytes[index] = nbytes


class Register:
    """``register<bit<W>>(size)``: data-plane state, zero at start, values masked to W bits."""

    def __init__(self, name: str, size: int, width: int) -> None:
        self.name = name
        self.size = size
        self.width = width
        self.mask = (1 << width) - 1
        self.values = [0] * size

    def read(self, index: int) -> int:
        return self.values[index]

    def write(self, index: int, value: int) -> None:
        self.values[index] = value & self.mask


class PacketReplicationEngine:
    """Multicast groups: group id -> replicas as (egress_port, instance) pairs."""

    def __init__(self) -> None:
        self.groups: dict[int, list[tuple[int, int]]] = {}

    @staticmethod
    def _check(group_id: int, replicas: list[tuple[int, int]]) -> None:
        if not 0 < group_id < (1 << 16):
            raise InvalidArgument(f"multicast group id {group_id} must be in 1..65535")
        if len(set(replicas)) != len(replicas):
            raise InvalidArgument(f"multicast group {group_id} repeats a replica")
        for port, _rid in replicas:
            if not 0 <= port < 511:
                raise InvalidArgument(f"multicast group {group_id}: bad egress port {port}")

    def insert(self, group_id: int, replicas: list[tuple[int, int]]) -> None:
        self._check(group_id, replicas)
        if group_id in self.groups:
            raise AlreadyExists(f"multicast group {group_id} exists")
        self.groups[group_id] = list(replicas)

    def modify(self, group_id: int, replicas: list[tuple[int, int]]) -> None:
        self._check(group_id, replicas)
        if group_id not in self.groups:
            raise NotFound(f"no multicast group {group_id}")
        self.groups[group_id] = list(replicas)

    def delete(self, group_id: int) -> None:
        if group_id not in self.groups:
            raise NotFound(f"no multicast group {group_id}")
        del self.groups[group_id]

    def replicas(self, group_id: int) -> list[tuple[int, int]]:
        """Replicas of a group; an unknown group replicates to nothing (BMv2 drops)."""
        return self.groups.get(group_id, [])
