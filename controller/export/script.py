"""The vLLM and SGLang exports rendered: ``<fmt>.sh``, one function per server that starts its
processes in dependency order and waits until each engine answers, and ``<fmt>.json``, the
same commands as data (docs/export.md, "Start order").

Order on every server: Ray heads, then Ray workers (each once its head's port answers), then
engines in the background, then a wait on each engine's ``/health``; the router function
waits for every instance of its pool before it starts the router. A server resolves its own
address first (``getent``) unless ``--address`` gave it: the NIXL side channel and Ray bind
to an address, not to a name.
"""

from __future__ import annotations

import json
import re
import shlex

from controller.export.engines import ADDR, ROUTER_HOST, RUN, Command
from controller.export.layout import InstanceView, Options, pools
from controller.models.engines import EngineProfile, in_flight

HELPERS = """\
TIMEOUT=${HEROSERVE_START_TIMEOUT:-1800}  # seconds a process may take to come up
LOGS=${HEROSERVE_LOGS:-./heroserve-logs}

addr_of() {  # the IPv4 address host $1 resolves to
  getent ahostsv4 "$1" | awk 'NR == 1 {print $1}'
}

wait_port() {  # until HOST:PORT (or [IPV6]:PORT) accepts TCP connections
  local host=${1%:*} port=${1##*:} t=0
  host=${host#[}; host=${host%]}
  until (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
    sleep 2; t=$((t + 2))
    if [ "$t" -ge "$TIMEOUT" ]; then echo "$1 did not answer in $TIMEOUT s" >&2; exit 1; fi
  done
}

wait_up() {  # until URL/health answers 200
  local t=0
  until curl -fsS -o /dev/null "$1/health"; do
    sleep 5; t=$((t + 5))
    if [ "$t" -ge "$TIMEOUT" ]; then echo "$1/health did not answer in $TIMEOUT s" >&2; exit 1; fi
  done
  echo "up: $1"
}
"""


# The script's own variables (engines.ADDR, engines.RUN) inside a token; values given on the
# command line never hold them (options.SCRIPT_VARS).
_VARS = re.compile("(" + "|".join(re.escape(v) for v in (ADDR, RUN)) + ")")


def _q(token: str) -> str:
    """``token`` as one shell word that expands to it: every piece single-quoted as data
    (``shlex.quote``) but the script's variables, each in double quotes on its own, so
    ``http://${ADDR}:8100`` is ``'http://'"${ADDR}"':8100'``."""
    pieces = [p for p in _VARS.split(token) if p]
    if not pieces:
        return "''"
    return "".join(f'"{p}"' if _VARS.fullmatch(p) else shlex.quote(p) for p in pieces)


def _comment(text: str) -> str:
    """``text`` for a ``#`` line: anything but printable characters dropped (a line break
    would end the comment)."""
    return "".join(c for c in text if c.isprintable())


def shell_line(c: Command) -> str:
    """``c`` as one shell command line: its environment, then its argv."""
    env = [f"{k}={_q(v)}" for k, v in c.env.items()]
    return " ".join(env + [_q(t) for t in c.argv])


def _servers(commands: list[Command]) -> list[str]:
    """The servers that run ``commands``, in first-use order (the routers' host aside)."""
    return list(dict.fromkeys(c.server for c in commands if c.server != ROUTER_HOST))


def _function(server: str) -> str:
    """The shell function of ``server``: one name per server, distinct for distinct servers.
    Letters and digits stay; ``_`` becomes ``__`` and any other character ``_XX`` (its code
    in hex), so ``srv-0``, ``srv_0`` and ``srv.0`` give ``on_srv_2d0``, ``on_srv__0`` and
    ``on_srv_2e0`` (read left to right, the escapes decode one way only)."""

    def esc(c: str) -> str:
        if c.isascii() and c.isalnum():
            return c
        return "__" if c == "_" else f"_{ord(c):02x}"

    return "on_" + "".join(esc(c) for c in server)


def _log(c: Command) -> str:
    name = "".join(ch if ch.isalnum() else "." for ch in f"{c.instance}-{c.server}-{c.what}")
    return f'"$LOGS/{name}.log"'


def _server_body(server: str, cmds: list[Command], opts: Options) -> list[str]:
    lines = []
    tokens = [t for c in cmds for t in [*c.argv, *c.env.values()]]
    if server != ROUTER_HOST and any(ADDR in t for t in tokens):
        if server in opts.addresses:
            lines.append(f"  ADDR={shlex.quote(opts.addresses[server])}")
        else:
            why = f"{server} does not resolve: give heroserve export --address {server}=IP"
            lines += [
                f"  ADDR=$(addr_of {shlex.quote(server)})",
                f'  [ -n "$ADDR" ] || {{ echo {shlex.quote(why)} >&2; exit 2; }}',
            ]
    if any(RUN in t for t in tokens):  # a new folder of this user's, never a fixed name
        lines.append('  RUN=$(mktemp -d "${TMPDIR:-/tmp}/heroserve-run.XXXXXXXX")')
    lines.append('  mkdir -p "$LOGS"')
    if server == ROUTER_HOST:  # a router starts once every instance of its pool answers
        for url in dict.fromkeys(t for c in cmds for t in c.argv if t.startswith("http://")):
            lines.append(f"  wait_up {_q(url)}")
    for c in sorted(cmds, key=lambda c: c.stage):
        lines.append(f"  # {_comment(c.instance)}: {_comment(c.what)}")
        if c.after:
            lines.append(f"  wait_port {_q(c.after)}")
        if c.stage <= 1:  # `ray start` returns once its node is up, which what follows needs
            lines.append(f"  {shell_line(c)}")
        else:
            lines.append(f"  {shell_line(c)} > {_log(c)} 2>&1 &")
    lines += [f"  wait_up {_q(c.health)}" for c in cmds if c.health]
    lines += ["  wait", "}", ""]
    return lines


def render_shell(
    fmt: str,
    profile: EngineProfile,
    commands: list[Command],
    views: list[InstanceView],
    opts: Options,
) -> str:
    servers = _servers(commands)
    lines = [
        "#!/usr/bin/env bash",
        f"# HeroServe {fmt} launch (heroserve export --format {fmt}; docs/export.md).",
        f"# {profile.name} {profile.versions}, KV connector {profile.kv_connector}.",
        f"# Every server needs: {', '.join(profile.installs)}, curl, and the NCCL tuner plugin",
        f"# at {_comment(opts.tuner_plugin)}; the router host needs {profile.router}.",
        f"# Run `bash {fmt}.sh SERVER` on each server ({', '.join(servers)}) and",
        f"# `bash {fmt}.sh router` on a host that reaches them; each waits for what it needs.",
        "set -euo pipefail",
        "",
        HELPERS,
    ]
    for v in views:
        peers = ", ".join(p.instance for p in v.kv_peers) or "none"
        lines.append(
            _comment(f"# {v.name}: TP={v.tp} PP={v.pp} batch={v.batch}, KV priced with: {peers}")
        )
        lines += [_comment(f"#   note: {n}") for n in v.notes]
    lines.append("")
    for s in [*servers, ROUTER_HOST]:
        lines.append(f"{_function(s)}() {{")
        lines += _server_body(s, [c for c in commands if c.server == s], opts)
    usage = shlex.quote(f"SERVER (one of: {' '.join([*servers, ROUTER_HOST])})")
    lines += [
        'case "${1:-}" in',
        *(f"  {shlex.quote(s)}) {_function(s)} ;;" for s in [*servers, ROUTER_HOST]),
        f'  *) echo "usage: $0" {usage} >&2; exit 2 ;;',
        "esac",
        "",
    ]
    return "\n".join(lines)


def render_json(
    fmt: str,
    profile: EngineProfile,
    commands: list[Command],
    views: list[InstanceView],
    opts: Options,
) -> str:
    servers = _servers(commands)
    doc = {
        "format": fmt,
        "engine": {"name": profile.name, "versions": profile.versions},
        "installs": {"servers": list(profile.installs), "router": profile.router},
        # null: the start script resolves the server's name (its ${ADDR})
        "addresses": {s: opts.addresses.get(s) for s in servers},
        # what the start script sets before the commands below, which name them
        "variables": {
            ADDR: "the server's address: addresses[server], else its name resolved (getent)",
            RUN: "a new folder per run of the server's script (mktemp -d, mode 0700)",
        },
        "instances": [
            {
                "name": v.name,
                "role": v.role,
                "tp": v.tp,
                "pp": v.pp,
                "batch": v.batch,
                # the request limit its command sets: the batch, raised for a pipelined prefill
                "in_flight": in_flight(profile, v.role, v.pp, v.batch),
                "servers": [
                    {"server": p.server, "gpus": p.cuda, "gpu_ids": p.gpu_ids} for p in v.servers
                ],
                "url": next(c.health for c in commands if c.instance == v.name and c.health),
                "kv_peers": [p.instance for p in v.kv_peers],
                "notes": v.notes,
            }
            for v in views
        ],
        "pools": [
            {
                "prefill": [v.name for v in pre],
                "decode": [v.name for v in dec],
                "router": router.health,
            }
            for (pre, dec), router in zip(
                pools(views), [c for c in commands if c.what == "router"], strict=True
            )
        ],
        "commands": [c.to_dict() for c in commands],
    }
    return json.dumps(doc, indent=1) + "\n"
