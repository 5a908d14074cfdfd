"""``python -m agents.switch.dump --switch ADDR --device-id N``: print, as JSON, the INA
entries a switch holds (aggregation_table, worker_port, result_rewrite, l2_forward,
multicast groups), read back through P4Runtime. For operators and tests; writes nothing."""

from agents.switch import main as _main  # noqa: F401, I001 - sets the protobuf runtime first

import argparse
import contextlib
import json
import sys

from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException
import p4runtime_sh.shell as sh


def dump(addr: str, device_id: int) -> dict:
    from agents.switch.p4rt import SwitchConnection
    from agents.switch.tables import (
        AggregationTable,
        L2Forward,
        MulticastGroups,
        ResultRewrite,
        WorkerPort,
    )

    # Election id 0: below any writer's, so this session never takes over as primary.
    conn = SwitchConnection(addr, device_id, None, b"", election_id=(0, 0))  # type: ignore[arg-type]
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the shell prints arbitration results
            conn.client = P4RuntimeClient(device_id, addr, (0, 0))
    except SystemExit as exc:
        raise RuntimeError(f"no P4Runtime session with {addr}") from exc
    try:
        sh.client = conn.client
        sh.context.set_p4info(conn.client.get_p4info())
        out = {
            "aggregation_table": sorted(
                [list(k), v[0], list(v[1])] for k, v in AggregationTable(conn).read().items()
            ),
            "worker_port": sorted(
                [list(k), v[0], list(v[1])] for k, v in WorkerPort(conn).read().items()
            ),
            "result_rewrite": sorted(
                [list(k), v[0], list(v[1])] for k, v in ResultRewrite(conn).read().items()
            ),
            "l2_forward": sorted(
                [list(k), v[0], list(v[1])] for k, v in L2Forward(conn).read().items()
            ),
            "multicast_groups": {str(g): list(p) for g, p in MulticastGroups(conn).read().items()},
        }
    finally:
        conn.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agents.switch.dump")
    p.add_argument("--switch", required=True)
    p.add_argument("--device-id", type=int, default=1)
    args = p.parse_args(argv)
    try:
        print(json.dumps(dump(args.switch, args.device_id), sort_keys=True))
    except (RuntimeError, P4RuntimeException) as exc:
        print(f"dump: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
