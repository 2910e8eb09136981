#!/usr/bin/env python3
"""A client nobody on the paddock team wrote: Python grpcio with stubs that grpc_tools.protoc
generates from the seed's Aria protos (proto/aria/v1/*.proto), calling the TaskService and the
NotificationService over the daemon's Aria Unix socket.

grpcio sends the socket path as the HTTP/2 authority, which the server side rejects; the channel
sets `grpc.default_authority` to `localhost` (documented in the README).

Run by `aria::a_python_grpcio_client_uses_the_task_service` (tests/e2e/aria.rs).
Needs: pip install grpcio grpcio-tools
"""

import argparse
import glob
import json
import os
import sys

import grpc
from grpc_tools import protoc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--proto-root", required=True)
    ap.add_argument("--stubs", required=True)
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.proto_root, "aria", "v1", "*.proto")))
    import grpc_tools
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(
        ["grpc_tools.protoc", f"-I{args.proto_root}", f"-I{well_known}",
         f"--python_out={args.stubs}",
         f"--grpc_python_out={args.stubs}"] + files
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with {rc}")
    sys.path.insert(0, args.stubs)
    from aria.v1 import aria_pb2, task_service_pb2 as t, task_service_pb2_grpc as tg
    from aria.v1 import notification_service_pb2 as n, notification_service_pb2_grpc as ng

    channel = grpc.insecure_channel(
        f"unix:{args.socket}", options=[("grpc.default_authority", "localhost")]
    )
    tasks = tg.TaskServiceStub(channel)
    notes = ng.NotificationServiceStub(channel).StreamNotifications(n.StreamNotificationsRequest())
    # The stream's call goes out in the background; give it a moment to be subscribed.
    import time
    time.sleep(0.5)

    # A type paddock does not run is refused (never run as a local command anyway).
    try:
        tasks.LaunchTask(t.LaunchTaskRequest(type="container:exec", command_json='["true"]'))
        raise AssertionError("container:exec was launched")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e

    launched = tasks.LaunchTask(t.LaunchTaskRequest(
        type="command",
        command_json=json.dumps(["sh", "-c", "echo from python; echo '::progress 100 done'"]),
        timeout_seconds=30,
    ))
    task_id = launched.task_id
    assert task_id.startswith("task_"), task_id

    lines = []
    for out in tasks.StreamTaskOutput(t.StreamTaskOutputRequest(task_id=task_id, follow=True)):
        kind = out.WhichOneof("output")
        lines.append((kind, getattr(out, kind)))
    assert ("stdout_line", "from python") in lines, lines
    assert any(k == "progress" and v.percent_complete == 100.0 for k, v in lines), lines

    task = tasks.GetTask(t.GetTaskRequest(task_id=task_id))
    assert task.status == aria_pb2.COMPLETED, task
    # The task is the caller's: its user, from the socket's credentials.
    import pwd
    assert task.user_id == pwd.getpwuid(os.getuid()).pw_name, task.user_id
    assert task.type == "command", task.type
    assert task.exit_code == 0 and task.progress_percent == 100.0, task

    seen = []
    for note in notes:
        if note.WhichOneof("event_payload") == "task_status" and note.task_status.task_id == task_id:
            seen.append(note.task_status.new_status)
            if note.task_status.new_status == aria_pb2.COMPLETED:
                break
    order = [aria_pb2.PENDING, aria_pb2.RUNNING, aria_pb2.COMPLETED]
    assert seen[-1] == aria_pb2.COMPLETED and seen == sorted(seen, key=order.index), seen
    notes.cancel()

    try:
        tasks.GetTask(t.GetTaskRequest(task_id="task_nope"))
        raise AssertionError("expected NOT_FOUND")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e

    print("grpcio task client: all checks passed")


if __name__ == "__main__":
    main()
