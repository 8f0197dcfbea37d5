"""Regenerate ``controller_pb2.py`` from ``controller.proto``.

    .venv/bin/pip install grpcio-tools
    .venv/bin/python -m plugins.pravega_controller.generate

The generated module is committed, so running the gateway needs only the
``protobuf`` runtime, not ``grpcio-tools``; run this after editing the
.proto and commit both. protoc is given the repository root as its include
path, so the descriptor is registered as
``plugins/pravega_controller/controller.proto``.
"""
import os
import sys

from grpc_tools import protoc

PROTO = "plugins/pravega_controller/controller.proto"


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return protoc.main(["protoc", f"-I{root}", f"--python_out={root}",
                        os.path.join(root, PROTO)])


if __name__ == "__main__":
    sys.exit(main())
