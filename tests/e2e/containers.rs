//! Aria's ContainerService on the real drivers: a bubblewrap container over the host's root
//! (no image) and a podman container from a root tarball the test builds; `container:exec`
//! tasks run in them (their environment, read-only host, no network), their logs are what
//! those tasks wrote (`since`, `follow`), stop / start / remove follow the container's life,
//! a session's containers go with its delete but the persistent ones, and every unknown id is
//! NOT_FOUND.

use std::time::Duration;

use paddock_proto::aria::v1 as aria;
use tonic::transport::Channel;

use crate::aria::aria_channel;
use crate::harness::*;
use crate::podman::{root_tarball, Containers as Cleanup};

type Ctr = aria::container_service_client::ContainerServiceClient<Channel>;
type Tasks = aria::task_service_client::TaskServiceClient<Channel>;

async fn clients(d: &Daemon) -> (Ctr, Tasks) {
    let ch = aria_channel(d).await;
    (Ctr::new(ch.clone()), Tasks::new(ch))
}

/// Runs `script` with `sh -c` in container `ctr`; the finished task.
async fn exec(t: &mut Tasks, ctr: &str, script: &str) -> aria::Task {
    let id = t
        .launch_task(aria::LaunchTaskRequest {
            r#type: "container:exec".into(),
            command_json: serde_json::to_string(&["sh", "-c", script]).unwrap(),
            container_id: ctr.into(),
            parent_task_id: "task_parent".into(),
            ..Default::default()
        })
        .await
        .expect("launch in the container")
        .into_inner()
        .task_id;
    finished(t, id).await
}

/// Task `id` once it has ended.
async fn finished(t: &mut Tasks, id: String) -> aria::Task {
    within(async {
        loop {
            let task = t
                .get_task(aria::GetTaskRequest {
                    task_id: id.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if task.completed_at.is_some() {
                return task;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// The container's stored logs, as (stream, line).
async fn logs(c: &mut Ctr, id: &str, since: Option<prost_types::Timestamp>) -> Vec<(i32, String)> {
    let mut s = c
        .stream_container_logs(aria::StreamContainerLogsRequest {
            container_id: id.into(),
            follow: false,
            since,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(l) = s.message().await.unwrap() {
        out.push((l.stream, l.line));
    }
    out
}

fn status_of(c: &aria::Container) -> aria::TaskStatus {
    aria::TaskStatus::try_from(c.status).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bubblewrap_container_runs_commands_keeps_their_logs_and_follows_its_life() {
    let d = Daemon::start().await;
    let _cleanup = Cleanup(d.dirs.data.clone());
    let (mut c, mut t) = clients(&d).await;
    let made = c
        .create_container(aria::CreateContainerRequest {
            name: "build".into(),
            environment: vec![aria::KeyValuePair {
                key: "FOO".into(),
                value: "bar".into(),
            }],
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner();
    assert!(made.id.starts_with("ctr_"), "{made:?}");
    assert_eq!(status_of(&made), aria::TaskStatus::Running);
    assert_eq!(
        (made.name.as_str(), made.image_path.as_str()),
        ("build", "")
    );
    assert!(!made.user_id.is_empty() && made.session_id.is_none());
    let got = c
        .get_container(aria::GetContainerRequest {
            container_id: made.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, made);
    let all = c
        .list_containers(aria::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(all, vec![made.clone()]);
    let of_session = c
        .list_containers(aria::ListContainersRequest {
            session_id: Some("sess_other".into()),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(of_session.is_empty());

    // A command in it: its variables, the host read-only, its own HOME, no network.
    let secret = d.dirs.home.join("secret.txt");
    std::fs::write(&secret, "HOST SECRET").unwrap();
    let task = exec(
        &mut t,
        &made.id,
        &format!(
            "echo foo=$FOO; echo to-stderr >&2; echo x > /usr/ctr-escape || echo host-read-only; \
             cat {} || echo no-secret",
            secret.display()
        ),
    )
    .await;
    assert_eq!(task.exit_code, Some(0), "{task:?}");
    assert_eq!(task.r#type, "container:exec");
    assert_eq!(task.container_id, made.id);
    assert_eq!(task.parent_task_id.as_deref(), Some("task_parent"));
    let lines = logs(&mut c, &made.id, None).await;
    let out = |s: aria::container_log::Stream, l: &str| (s as i32, l.to_string());
    use aria::container_log::Stream::{Stderr, Stdout};
    for want in [
        out(Stdout, "foo=bar"),
        out(Stderr, "to-stderr"),
        out(Stdout, "host-read-only"),
        out(Stdout, "no-secret"),
    ] {
        assert!(lines.contains(&want), "{want:?} not in {lines:?}");
    }
    assert!(!std::path::Path::new("/usr/ctr-escape").exists());
    // `since` after everything: nothing.
    let later = prost_types::Timestamp {
        seconds: 4_000_000_000,
        nanos: 0,
    };
    assert!(logs(&mut c, &made.id, Some(later)).await.is_empty());

    // Following: what is stored, once each, then a later command's lines as they come (a
    // command of another container writing meanwhile is not this one's).
    let mut follow = c
        .stream_container_logs(aria::StreamContainerLogsRequest {
            container_id: made.id.clone(),
            follow: true,
            since: None,
        })
        .await
        .unwrap()
        .into_inner();
    let other = t
        .launch_task(aria::LaunchTaskRequest {
            command_json: r#"["sh", "-c", "echo not-this-container"]"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task_id;
    finished(&mut t, other).await;
    exec(&mut t, &made.id, "echo second-command; echo third-line").await;
    let followed = within(async {
        let mut got = Vec::new();
        loop {
            let l = follow.message().await.unwrap().unwrap();
            got.push((l.stream, l.line.clone()));
            if l.line == "third-line" {
                return got;
            }
        }
    })
    .await;
    let mut want = lines.clone();
    want.extend([out(Stdout, "second-command"), out(Stdout, "third-line")]);
    assert_eq!(followed, want);

    // Stopped: no command runs in it (and what ran is ended); started again: it does.
    let slow = t
        .launch_task(aria::LaunchTaskRequest {
            command_json: r#"["sleep", "300"]"#.into(),
            container_id: made.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task_id;
    c.stop_container(aria::StopContainerRequest {
        container_id: made.id.clone(),
    })
    .await
    .unwrap();
    let stopped = c
        .get_container(aria::GetContainerRequest {
            container_id: made.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status_of(&stopped), aria::TaskStatus::Completed);
    within(async {
        loop {
            let task = t
                .get_task(aria::GetTaskRequest {
                    task_id: slow.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if task.status == aria::TaskStatus::Cancelled as i32 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let e = t
        .launch_task(aria::LaunchTaskRequest {
            command_json: r#"["true"]"#.into(),
            container_id: made.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    c.start_container(aria::StartContainerRequest {
        container_id: made.id.clone(),
    })
    .await
    .unwrap();
    assert_eq!(exec(&mut t, &made.id, "true").await.exit_code, Some(0));

    // Removed: gone, and every call about it is NOT_FOUND.
    c.remove_container(aria::RemoveContainerRequest {
        container_id: made.id.clone(),
    })
    .await
    .unwrap();
    // Its environment goes once the driver's work for it is done (off the event loop).
    let env_dir = d.dirs.data.join("environments").join(&made.id);
    for _ in 0..100 {
        if !env_dir.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!env_dir.exists(), "{}", env_dir.display());
    let id = made.id.clone();
    for e in [
        c.get_container(aria::GetContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err(),
        c.start_container(aria::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err(),
        c.stop_container(aria::StopContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err(),
        c.remove_container(aria::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err(),
        c.stream_container_logs(aria::StreamContainerLogsRequest {
            container_id: id.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err(),
        t.launch_task(aria::LaunchTaskRequest {
            command_json: r#"["true"]"#.into(),
            container_id: id.clone(),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err(),
    ] {
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_containers_belong_to_their_session_unless_persistent() {
    let mut d = Daemon::start().await;
    let _cleanup = Cleanup(d.dirs.data.clone());
    let tarball = root_tarball(&d.dirs.base);
    let (mut c, mut t) = clients(&d).await;
    let session = d.session(None).await.id;
    let mut ids = Vec::new();
    for persistent in [false, true] {
        let made = c
            .create_container(aria::CreateContainerRequest {
                name: format!("p-{persistent}"),
                image_path: tarball.display().to_string(),
                persistent,
                session_id: session.clone(),
                environment: vec![aria::KeyValuePair {
                    key: "IN_PODMAN".into(),
                    value: "yes".into(),
                }],
                ..Default::default()
            })
            .await
            .expect("create a podman container")
            .into_inner();
        assert_eq!(status_of(&made), aria::TaskStatus::Running);
        assert_eq!(made.session_id.as_deref(), Some(session.as_str()));
        ids.push(made.id);
    }
    let listed = c
        .list_containers(aria::ListContainersRequest {
            session_id: Some(session.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 2);
    // Its own root (the tarball's /usr/bin), the container's variables.
    let task = exec(&mut t, &ids[0], "ls /usr/bin; echo in=$IN_PODMAN").await;
    assert_eq!(task.exit_code, Some(0), "{task:?}");
    let lines: Vec<String> = logs(&mut c, &ids[0], None)
        .await
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    assert!(lines.contains(&"in=yes".to_string()), "{lines:?}");
    assert!(
        !lines.contains(&"podman".to_string()),
        "not the host's /usr/bin: {lines:?}"
    );

    // A stop and a start at once happen in that order: the container runs after them.
    c.stop_container(aria::StopContainerRequest {
        container_id: ids[1].clone(),
    })
    .await
    .unwrap();
    c.start_container(aria::StartContainerRequest {
        container_id: ids[1].clone(),
    })
    .await
    .unwrap();
    let task = exec(&mut t, &ids[1], "echo after-restart").await;
    assert_eq!(task.exit_code, Some(0), "{task:?}");

    // The session's delete takes its container, not the persistent one.
    d.stop(&session, false).await.unwrap();
    d.client()
        .await
        .delete_session(paddock_proto::obey::local::v1::DeleteSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap();
    let e = c
        .get_container(aria::GetContainerRequest {
            container_id: ids[0].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    within(async {
        while std::process::Command::new("podman")
            .args(["container", "exists", &format!("paddock-{}", ids[0])])
            .status()
            .unwrap()
            .success()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let kept = c
        .get_container(aria::GetContainerRequest {
            container_id: ids[1].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status_of(&kept), aria::TaskStatus::Running);
    c.remove_container(aria::RemoveContainerRequest {
        container_id: ids[1].clone(),
    })
    .await
    .unwrap();

    // What the host cannot give is refused before anything is made.
    let bad = [
        (
            aria::CreateContainerRequest {
                image_path: "localhost/no-such-image:0".into(),
                ..Default::default()
            },
            tonic::Code::FailedPrecondition,
            "not on this machine",
        ),
        (
            aria::CreateContainerRequest {
                driver: "local".into(),
                ..Default::default()
            },
            tonic::Code::InvalidArgument,
            "\"podman\" or \"bubblewrap\"",
        ),
        (
            aria::CreateContainerRequest {
                session_id: "sess_nope".into(),
                ..Default::default()
            },
            tonic::Code::NotFound,
            "sess_nope",
        ),
    ];
    for (req, code, says) in bad {
        let e = c.create_container(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(says), "{says:?} not in {e:?}");
    }
    let all = c
        .list_containers(aria::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(all.is_empty(), "nothing half-made: {all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_outlives_a_daemon_restart() {
    let mut d = Daemon::start().await;
    let _cleanup = Cleanup(d.dirs.data.clone());
    let (mut c, _) = clients(&d).await;
    let made = c
        .create_container(aria::CreateContainerRequest {
            name: "kept".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    drop(c);
    d.kill9();
    d.launch().await;
    let (mut c, mut t) = clients(&d).await;
    let got = c
        .get_container(aria::GetContainerRequest {
            container_id: made.id.clone(),
        })
        .await
        .expect("still known after the restart")
        .into_inner();
    assert_eq!(got, made);
    assert!(
        d.dirs.data.join("environments").join(&made.id).is_dir(),
        "its environment is not taken for a deleted session's"
    );
    let task = exec(&mut t, &made.id, "echo still-here").await;
    assert_eq!(task.exit_code, Some(0), "{task:?}");
}
