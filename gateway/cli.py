"""``gateway``: the operator's command line.

``gateway run -c config.yaml [--ports-file PATH]`` starts the gateway in the
foreground. A bad config is one line on stderr and exit status 2; a
listener that cannot bind, one line and exit status 1. SIGTERM and SIGINT
stop it cleanly: listeners first, the store (and its last fsync) last.
"""
import argparse
import json
import os
import sys

from twisted.logger import Logger, globalLogBeginner, textFileLogObserver

from gateway.config import ConfigError, load_config
from gateway.dialects import find_dialects

log = Logger()


def describe_address(address):
    return f"{address.host}:{address.port}"


def write_ports_file(path, config, bound):
    """Write the bound addresses as JSON, atomically (tests poll for the file)."""
    doc = {"data": config.storage.path,
           "listeners": [{"dialect": listener.dialect, "endpoint": listener.endpoint,
                          "host": address.host, "port": address.port}
                         for listener, address in bound]}
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

    from twisted.internet import reactor

    from gateway.service import GatewayService

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)],
                                     redirectStandardIO=False)
    service = GatewayService(config, reactor, dialects)
    status = {"code": 0}

    def listening(bound):
        for listener, address in bound:
            print(f"{listener.dialect:<10} {listener.path:<14} listening on "
                  f"{describe_address(address)}", flush=True)
        print(f"data directory: {config.storage.path} (fsync: {config.storage.fsync})",
              flush=True)
        if args.ports_file:
            write_ports_file(args.ports_file, config, bound)

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
        service.whenListening().addCallbacks(listening, failed)

    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown",
                                  lambda: service.stopService() if service.running else None)
    reactor.run()
    return status["code"]


def build_parser():
    parser = argparse.ArgumentParser(prog="gateway", description="Multi-protocol log gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the gateway in the foreground")
    run.add_argument("-c", "--config", default="config.yaml", help="path to config.yaml")
    run.add_argument("--ports-file", help="write every listener's bound address here as JSON")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
