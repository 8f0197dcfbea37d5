"""``gateway``: the operator's command line.

``gateway run -c config.yaml [--ports-file PATH]`` starts the gateway in the
foreground. A bad config is one line on stderr and exit status 2; a
listener that cannot bind, one line and exit status 1. SIGTERM and SIGINT
stop it cleanly: listeners first, the store (and its last fsync) last.
SIGHUP reloads the config file (``GatewayService.reload``) and rewrites
the ports file; ``--log-format json`` logs one JSON event a line.

The other commands are clients of a running gateway (``topics``,
``groups``, ``produce``, ``consume``: the ``gateway.cli_*`` modules, through a
listener of any dialect) or read a stopped gateway's data directory
(``check``). Every failure is one line on stderr, ``gateway: ...``, and an
exit status:

- 0: done (``check``: no problems);
- 1: the gateway refused (unknown topic, record too large, ...), or
  ``check`` found problems;
- 2: bad usage: an option, an address, an operation the dialect does not
  have, a bad config or data directory;
- 3: the gateway cannot be reached (no answer within ``--timeout``), or
  the data directory ``check`` was given is in use;
- 130: interrupted (Ctrl-C; the way to end ``consume -f``).
"""
import argparse
import json
import os
import sys

from twisted.logger import Logger, globalLogBeginner

from gateway.cli_clients import DEFAULT_PORTS, DIALECTS, UNREACHABLE, CLIError
from gateway.config import ConfigError, load_config
from gateway.dialects import find_dialects

log = Logger()


def describe_address(address):
    return f"{address.host}:{address.port}"


def write_ports_file(path, config, bound, metrics=None):
    """Write the bound addresses as JSON, atomically (tests poll for the file);
    ``metrics`` is the metrics endpoint's bound address, if there is one."""
    doc = {"data": config.storage.path,
           "listeners": [{"dialect": listener.dialect, "endpoint": listener.endpoint,
                          "host": address.host, "port": address.port}
                         for listener, address in bound]}
    if metrics is not None:
        doc["metrics"] = {"endpoint": config.metrics.endpoint, "host": metrics.host,
                          "port": metrics.port}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def cmd_run(args):
    dialects = find_dialects()
    try:
        config = load_config(args.config, dialects)
    except ConfigError as e:
        print(f"gateway: bad config: {e}", file=sys.stderr)
        return 2

    from twisted.internet import defer, reactor

    from gateway.logs import observer
    from gateway.service import GatewayService, install_reload_signal

    globalLogBeginner.beginLoggingTo([observer(args.log_format, sys.stderr)],
                                     redirectStandardIO=False)
    service = GatewayService(config, reactor, dialects)
    status = {"code": 0}

    def listening(bound):
        # After a reload (SIGHUP) too: the listeners may have changed.
        config = service.config
        metrics = service.status.address if service.status is not None else None
        for listener, address in bound:
            print(f"{listener.dialect:<10} {listener.path:<14} listening on "
                  f"{describe_address(address)}", flush=True)
        if metrics is not None:
            print(f"{'metrics':<10} {'':<14} status page on http"
                  f"{'s' if config.metrics.endpoint.startswith('ssl:') else ''}://"
                  f"{describe_address(metrics)}/", flush=True)
        print(f"data directory: {config.storage.path} (fsync: {config.storage.fsync})",
              flush=True)
        if args.ports_file:
            write_ports_file(args.ports_file, config, bound, metrics)

    def failed(failure):
        print(f"gateway: cannot listen: {failure.getErrorMessage()}", file=sys.stderr)
        status["code"] = 1
        reactor.stop()

    def start():
        try:
            service.startService()
        except Exception as e:
            print(f"gateway: cannot start: {e}", file=sys.stderr)
            status["code"] = 1
            reactor.stop()
            return
        waits = [service.whenListening()]
        if service.status is not None:
            waits.append(service.status.whenListening())
        defer.gatherResults(waits, consumeErrors=True).addCallbacks(
            lambda results: listening(results[0]),
            lambda f: failed(f.value.subFailure if isinstance(f.value, defer.FirstError) else f))
        install_reload_signal(service, reactor, listening)

    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown",
                                  lambda: service.stopService() if service.running else None)
    reactor.run()
    return status["code"]


INTERRUPTED = 130


def describe_failure(failure):
    """(one-line message, exit status) for a command's failure."""
    from twisted.internet import defer, error

    e = failure.value
    if isinstance(e, CLIError):
        return str(e), e.code
    if isinstance(e, defer.TimeoutError):
        return "no answer from the gateway in time (see --timeout)", UNREACHABLE
    if isinstance(e, (error.ConnectError, error.ConnectionLost, error.ConnectionDone)):
        return f"cannot reach the gateway: {e}", UNREACHABLE
    from plugins.figg.client import FiggClientClosed
    from plugins.pravega.client import PravegaError
    from plugins.rustlog.client import RustLogError
    from plugins.tank.client import TankError
    if isinstance(e, PravegaError):
        segment = getattr(e.reply, "segment", "")
        return f"pravega: {type(e.reply).__name__} {segment}".rstrip(), 1
    if isinstance(e, RustLogError):
        return f"rustlog: {e.message}", 1
    if isinstance(e, TankError):
        return f"tank: {e}", 1
    if isinstance(e, FiggClientClosed):
        return "figg: the connection closed", UNREACHABLE
    return f"internal error: {failure.getTraceback()}", 1


def run_client(command, args):
    """Run ``command(reactor, args)`` (a Deferred of the exit status) on the
    reactor; return its exit status."""
    from twisted.internet import defer, reactor

    status = []
    interrupted = []

    def failed(failure):
        if interrupted:
            return      # the connections failing as the reactor stops: not news
        message, code = describe_failure(failure)
        print(f"gateway: {message}", file=sys.stderr)
        status.append(code)

    def stopping():
        if not status:
            interrupted.append(True)    # a signal, not the command's end

    def start():
        d = defer.maybeDeferred(command, reactor, args)
        d.addCallbacks(status.append, failed)
        d.addBoth(lambda _: reactor.stop() if not interrupted else None)
    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown", stopping)
    reactor.run()
    return INTERRUPTED if interrupted else status[0]


def online(command):
    """An argparse ``func`` running ``command`` against a running gateway."""
    return lambda args: run_client(command, args)


def add_connection(parser, dialects, default):
    """``--dialect``, ``--bootstrap``, ``--timeout`` (and ``--scope`` where
    Pravega is one of ``dialects``)."""
    ports = ", ".join(f"{d} {DEFAULT_PORTS[d]}" for d in dialects)
    if len(dialects) > 1:
        parser.add_argument("-d", "--dialect", choices=dialects, default=default,
                            help=f"the listener's dialect (default {default})")
    else:
        parser.set_defaults(dialect=default)
    parser.add_argument("-b", "--bootstrap", metavar="HOST:PORT",
                        help=f"the listener's address (default 127.0.0.1 and the dialect's "
                             f"port in the shipped config.yaml: {ports})")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait to connect and for each answer (default 10)")
    if "pravega" in dialects:
        parser.add_argument("--scope", default="gateway",
                            help="the Pravega listener's scope (default gateway)")
    else:
        parser.set_defaults(scope="gateway")


def build_parser():
    from gateway import cli_admin, cli_check, cli_io

    parser = argparse.ArgumentParser(prog="gateway", description="Multi-protocol log gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the gateway in the foreground")
    run.add_argument("-c", "--config", default="config.yaml", help="path to config.yaml")
    run.add_argument("--ports-file", help="write every listener's bound address here as JSON")
    run.add_argument("--log-format", choices=("text", "json"), default="text",
                     help="log lines for people (text, the default) or JSON, one event a line")
    run.set_defaults(func=cmd_run)

    topics = sub.add_parser("topics", help="list, create and describe topics").add_subparsers(
        dest="action", required=True)
    p = topics.add_parser("list", help="every topic and its partition count")
    add_connection(p, DIALECTS, "tank")
    p.set_defaults(func=online(cli_admin.topics_list))
    p = topics.add_parser("create", help="create a topic")
    p.add_argument("topic")
    p.add_argument("-p", "--partitions", type=int, default=1)
    add_connection(p, DIALECTS, "tank")
    p.set_defaults(func=online(cli_admin.topics_create))
    p = topics.add_parser("describe", help="each partition's log start and end, in every "
                                           "dialect's positions")
    p.add_argument("topic")
    add_connection(p, DIALECTS, "tank")
    p.add_argument("--pravega", metavar="HOST:PORT",
                   default=f"127.0.0.1:{DEFAULT_PORTS['pravega']}",
                   help="the Pravega listener that gives byte positions, or 'none' "
                        "(default 127.0.0.1:12345)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=online(cli_admin.topics_describe))

    groups = sub.add_parser("groups", help="consumer groups (through the Kafka listener)"
                            ).add_subparsers(dest="action", required=True)
    p = groups.add_parser("list", help="the groups with live members")
    add_connection(p, ("kafka",), "kafka")
    p.set_defaults(func=online(cli_admin.groups_list))
    p = groups.add_parser("describe", help="a group's members and committed offsets, "
                                           "whichever dialect committed them")
    p.add_argument("group")
    p.add_argument("-t", "--topic", action="append",
                   help="only this topic (repeatable; default every topic)")
    add_connection(p, ("kafka",), "kafka")
    p.set_defaults(func=online(cli_admin.groups_describe))

    p = sub.add_parser("produce", help="produce standard input's lines as records")
    p.add_argument("topic")
    p.add_argument("-p", "--partition", type=int, default=0)
    p.add_argument("-k", "--key-separator", metavar="SEP",
                   help="split each line at the first SEP into key and value (kafka, tank)")
    add_connection(p, DIALECTS, "kafka")
    p.set_defaults(func=online(cli_io.produce))

    p = sub.add_parser("consume", help="print a partition's records, one per line")
    p.add_argument("topic")
    p.add_argument("-p", "--partition", type=int, default=0)
    p.add_argument("--from", dest="start", type=cli_io.parse_start, default="beginning",
                   metavar="beginning|end|POSITION",
                   help="where to start; POSITION is the dialect's own (offset, TANK seq, "
                        "Figg offset, Pravega byte position), as --show-position prints it")
    p.add_argument("-f", "--follow", action="store_true",
                   help="wait at the end for new records, until interrupted")
    p.add_argument("-n", "--count", type=int, help="stop after this many records")
    p.add_argument("-P", "--show-position", action="store_true",
                   help="print each record's position first")
    p.add_argument("-K", "--show-key", action="store_true",
                   help="print each record's key before its value (kafka, tank)")
    add_connection(p, DIALECTS, "kafka")
    p.set_defaults(func=online(cli_io.consume))

    p = sub.add_parser("check", help="verify a stopped gateway's data directory")
    p.add_argument("path", nargs="?",
                   help="the data directory (default: storage.path of --config)")
    p.add_argument("-c", "--config", default="config.yaml",
                   help="config.yaml naming the data directory")
    p.add_argument("--deep", action="store_true",
                   help="also decode every batch through the dialects' formats")
    p.add_argument("--repair", action="store_true",
                   help="apply the gateway's recovery (cuts torn tails) and rebuild wrong "
                        "indexes; the only option that writes")
    p.add_argument("--index-interval-bytes", type=int, default=4096,
                   help="index density for rebuilt indexes (storage.index_interval_bytes)")
    p.add_argument("--force", action="store_true",
                   help="check even if a process has the directory open")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only findings and the summary")
    p.set_defaults(func=cli_check.command)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    finally:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            # the reader went away: stop Python reporting it again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
