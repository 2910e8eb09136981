#!/usr/bin/env python3
"""A reflection client nobody on the paddock team wrote: grpcio-reflection's
ProtoReflectionDescriptorDatabase (server reflection v1alpha), over paddock's Unix socket.

Run by the Rust test `python_grpcio_reflection_lists_and_describes_the_services`
(tests/e2e/rpcs.rs). It lists the services, resolves one method's request type by name, and
asks grpc.health.v1 with grpcio-health-checking's stubs when present. The channel sets
`grpc.default_authority` (see tests/runner/grpcio_client.py for why).

Needs: pip install grpcio grpcio-reflection
"""

import argparse
import sys

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from google.protobuf.descriptor_pool import DescriptorPool


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    args = p.parse_args()
    channel = grpc.insecure_channel(
        f"unix:{args.socket}", options=[("grpc.default_authority", "localhost")]
    )
    db = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(db.get_services())
    print("services:", " ".join(services))
    for want in ("obey.local.v1.LocalDaemonService", "grpc.health.v1.Health"):
        if want not in services:
            print(f"missing {want}", file=sys.stderr)
            return 1
    pool = DescriptorPool(db)
    svc = pool.FindServiceByName("obey.local.v1.LocalDaemonService")
    method = svc.FindMethodByName("CreateSession")
    print("CreateSession takes", method.input_type.full_name)
    if method.input_type.full_name != "obey.local.v1.CreateSessionRequest":
        return 1
    fields = [f.name for f in method.input_type.fields]
    if "campaign_id" not in fields:
        print("CreateSessionRequest lacks campaign_id:", fields, file=sys.stderr)
        return 1
    print("grpcio reflection client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
