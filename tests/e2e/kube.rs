//! The kubernetes driver against a fake API server (`kube_fake.rs`): no Kubernetes API server
//! can run on these machines, so the test starts one that serves the subset the driver uses
//! (pods: create, get, list, watch, delete, log, exec over `v5/v4.channel.k8s.io`) with
//! Kubernetes' JSON shapes and semantics. Its "pods" are directories and processes of this
//! machine; what is real is everything paddock does: kube-rs with a kubeconfig, the pod
//! created with its labels, the binary copied in through an exec's stdin, the runner started
//! in the pod, the agent relayed through exec streams that drop and come back.

use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;

use crate::harness::*;
use crate::kube_fake::FakeKube;
use crate::ssh::long_turn;

fn pod_request(req: &mut pb::CreateSessionRequest, k: pb::KubernetesOptions) {
    req.environment_spec = Some(pb::SessionEnvironment {
        driver: "kubernetes".into(),
        kubernetes: Some(k),
        ..Default::default()
    });
}

/// latis' kubernetes block for the fake's cluster: the seed's shape, a working directory of
/// the test's.
fn options(kube: &FakeKube, workdir: &std::path::Path) -> pb::KubernetesOptions {
    pb::KubernetesOptions {
        namespace: "agents".into(),
        service_account: "paddock-agent".into(),
        pod_spec_json: serde_json::json!({
            "containers": [{
                "name": "agent",
                "image": "ghcr.io/example/workspace:latest",
                "workingDir": workdir.display().to_string(),
                "resources": {"limits": {"memory": "4Gi", "cpu": "2"}},
            }],
        })
        .to_string(),
        kubeconfig: kube.kubeconfig().display().to_string(),
        context: String::new(),
    }
}

/// The session's pod, as the API server stores it.
fn pod_of(kube: &FakeKube, id: &str) -> Option<serde_json::Value> {
    kube.pods()
        .into_iter()
        .find(|p| p["metadata"]["labels"]["paddock.dev/session"] == id)
}

#[tokio::test]
async fn a_session_in_a_pod_runs_whole_turns_through_dropped_streams() {
    let mut d = Daemon::start().await;
    let kube = FakeKube::start(&d.dirs.base.join("k"), &["agents"], &["paddock-agent"]);
    let mut req = d.request(Some(("long", long_turn(30, 100)))).await;
    pod_request(&mut req, options(&kube, &d.dirs.root));
    let id = d.create(req).await.id;
    d.wait_status(&id, pb::SessionStatus::Running).await;

    // The pod: the spec's, labelled so that paddock finds it again, with its service account.
    let pod = pod_of(&kube, &id).expect("the session's pod");
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    assert_eq!(pod["metadata"]["namespace"], "agents");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "paddock"
    );
    assert_eq!(pod["spec"]["serviceAccountName"], "paddock-agent");
    let agent = &pod["spec"]["containers"][0];
    assert_eq!(agent["image"], "ghcr.io/example/workspace:latest");
    assert_eq!(agent["resources"]["limits"]["memory"], "4Gi");
    assert_eq!(pod["status"]["phase"], "Running");
    let env_root = d.dirs.data.join("environments").join(&id);
    let log = std::fs::read_to_string(env_root.join("environment.log")).unwrap();
    for said in [
        "created pod agents/",
        "is running",
        "copied paddock",
        "runner on pod",
    ] {
        assert!(log.contains(said), "{said}: {log}");
    }
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "status", &id]).await;
    assert!(
        o.stdout.contains(&format!(
            "kubernetes (pod {name} in namespace agents, from its podSpec"
        )),
        "{o:?}"
    );
    let in_pod = || crate::kube_fake::marked_pids(|pod, _| pod == uid);

    // A turn; its exec streams cut after a few steps while the API server is down: the session
    // is marked disconnected, then the turn ends with every step once.
    let mut turn = d.start_turn(&id, "go").await;
    let first = collect_until(&mut turn, |a| a.content == "step 5 of 30").await;
    let execs = kube.exec_count();
    kube.set_down(true);
    kube.drop_execs();
    within(async {
        while !d.get(&id).await.disconnected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(status_name(d.get(&id).await.status), "WORKING");
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "list"]).await;
    assert!(o.stdout.contains("working (disconnected)"), "{o:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kube.set_down(false);
    let rest = within(collect_until(&mut turn, |a| kind(a) == "COMPLETION")).await;
    assert!(!d.get(&id).await.disconnected);
    assert!(
        kube.exec_count() > execs,
        "the relay came back through new execs"
    );
    let all: Vec<pb::SessionActivityEvent> = first.into_iter().chain(rest).collect();
    let steps: Vec<&str> = all
        .iter()
        .filter(|a| a.content.starts_with("step "))
        .map(|a| a.content.as_str())
        .collect();
    let want: Vec<String> = (1..=30).map(|i| format!("step {i} of 30")).collect();
    assert_eq!(steps, want, "{all:#?}");
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(
        all.iter()
            .any(|a| kind(a) == "STATUS" && a.content.contains("reconnected")),
        "{all:#?}"
    );

    // A command run in the session runs in the pod, in the container's working directory.
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let o = crate::environments::exec_sh(&d, &id, "echo pod=$PADDOCK_FAKE_KUBE_POD; pwd").await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains(&format!("pod={uid}")), "{o:?}");
    assert!(
        o.stdout.contains(&d.dirs.root.display().to_string()),
        "{o:?}"
    );
    // The environment's log shows the pod and its own log (the container paddock kept alive).
    let o =
        crate::latis::cli_in(&d, &d.dirs.root, &["session", "logs", "--environment", &id]).await;
    assert!(
        o.stdout.contains(&format!("pod agents/{name}: Running")),
        "{o:?}"
    );
    assert!(o.stdout.contains("paddock: pod ready"), "{o:?}");

    // The daemon killed mid-turn: the relay lives on in the local runner; the restarted daemon
    // takes the session back and the turn ends with every step once.
    // Pods of this paddock's whose session is gone (a crash between a delete and the pod's
    // removal) are found by their labels and deleted at the next start; another paddock's
    // (another user's, on a team's cluster) are left alone.
    let owner = pod["metadata"]["labels"]["paddock.dev/owner"]
        .as_str()
        .unwrap()
        .to_string();
    let mine = serde_json::json!({"app.kubernetes.io/managed-by": "paddock",
        "paddock.dev/session": "sess_GONE", "paddock.dev/owner": owner});
    create_labelled(&kube, "paddock-sess-gone", mine).await;
    let theirs = serde_json::json!({"app.kubernetes.io/managed-by": "paddock",
        "paddock.dev/session": "sess_THEIRS", "paddock.dev/owner": "0123456789abcdef"});
    create_labelled(&kube, "paddock-sess-theirs", theirs).await;
    crate::ssh::survive_a_daemon_kill(&mut d, &id, &want, "All 2 done: again").await;
    let named = |n: &str| kube.pods().into_iter().any(|p| p["metadata"]["name"] == n);
    within(async {
        while named("paddock-sess-gone") {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(named("paddock-sess-theirs"));
    assert!(named(&name), "the session's own pod stays");

    // Delete removes the pod, and everything that ran in it.
    assert!(!in_pod().is_empty());
    d.stop(&id, true).await.unwrap();
    d.wait_status(&id, pb::SessionStatus::Stopped).await;
    d.client()
        .await
        .delete_session(pb::DeleteSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap();
    within(async {
        while pod_of(&kube, &id).is_some() || !in_pod().is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop(kube);
}

#[tokio::test]
async fn bad_kubernetes_configurations_refuse_the_create_with_the_reason() {
    let mut d = Daemon::start().await;
    let kube = FakeKube::start(&d.dirs.base.join("k"), &["agents"], &[]);
    let root = d.dirs.root.clone();
    let bad_token = d.dirs.base.join("bad-kubeconfig");
    std::fs::write(
        &bad_token,
        std::fs::read_to_string(kube.kubeconfig())
            .unwrap()
            .replace("token: ", "token: wrong-"),
    )
    .unwrap();
    let cases: Vec<(pb::KubernetesOptions, &str)> = vec![
        (
            pb::KubernetesOptions {
                namespace: "nope".into(),
                service_account: String::new(),
                ..options(&kube, &root)
            },
            "namespaces \"nope\" not found (create it",
        ),
        (
            pb::KubernetesOptions {
                service_account: "ghost".into(),
                ..options(&kube, &root)
            },
            "serviceaccount \"ghost\" not found",
        ),
        (
            pb::KubernetesOptions {
                service_account: String::new(),
                kubeconfig: bad_token.display().to_string(),
                ..options(&kube, &root)
            },
            "credentials were refused",
        ),
        (
            pb::KubernetesOptions {
                service_account: String::new(),
                context: "elsewhere".into(),
                ..options(&kube, &root)
            },
            "the kubeconfig has no context \"elsewhere\"",
        ),
        (
            pb::KubernetesOptions {
                service_account: String::new(),
                kubeconfig: d.dirs.base.join("missing").display().to_string(),
                ..options(&kube, &root)
            },
            "cannot read the kubeconfig",
        ),
        (
            pb::KubernetesOptions {
                namespace: "Not_A_Name".into(),
                ..options(&kube, &root)
            },
            "is not a namespace name",
        ),
    ];
    for (k, reason) in cases {
        let mut req = d.request(None).await;
        pod_request(&mut req, k);
        crate::ssh::assert_refused(&d, req, reason).await;
    }
    // An API server that does not answer.
    kube.set_down(true);
    let mut req = d.request(None).await;
    pod_request(
        &mut req,
        pb::KubernetesOptions {
            service_account: String::new(),
            ..options(&kube, &root)
        },
    );
    crate::ssh::assert_refused(&d, req, "cannot reach the cluster's API server").await;
    kube.set_down(false);
    assert!(d.all_sessions().await.is_empty());
    assert!(kube.pods().is_empty(), "{:#?}", kube.pods());

    // An API server that speaks only v4.channel.k8s.io (before 1.30: stdin cannot be closed):
    // the copy and the relay work all the same. No working directory given: the image's.
    kube.speak_only_v4(true);
    let mut req = d.request(None).await;
    let mut k = options(&kube, &root);
    k.pod_spec_json = r#"{"containers":[{"name":"agent","image":"debian:12"}]}"#.into();
    k.service_account = String::new();
    pod_request(&mut req, k);
    let id = d.create(req).await.id;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let o = crate::environments::exec_sh(&d, &id, "pwd").await;
    assert_eq!(o.code, 0, "{o:?}");
    let pod = pod_of(&kube, &id).unwrap();
    let home = kube.pod_dir("agents", pod["metadata"]["name"].as_str().unwrap());
    assert!(
        o.stdout.trim().starts_with(&home.display().to_string()),
        "{o:?} {home:?}"
    );
    let acts = d.send(&id, "hello").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:#?}");
    d.stop(&id, true).await.unwrap();
}

/// The fake's pods in namespace `agents`, through kube-rs (as kubectl would reach them).
async fn pods_api(kube: &FakeKube) -> kube::Api<k8s_openapi::api::core::v1::Pod> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kube.kubeconfig()).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "agents")
}

/// Deletes a pod the way someone else would (kubectl delete), through the API server.
async fn delete_outside_paddock(kube: &FakeKube, name: &str) {
    pods_api(kube)
        .await
        .delete(name, &Default::default())
        .await
        .unwrap();
}

/// Creates pod `name` with `labels`, as a crash would have left one of paddock's (or as
/// another user's paddock made one).
async fn create_labelled(kube: &FakeKube, name: &str, labels: serde_json::Value) {
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "agent", "image": "debian:12"}]},
    }))
    .unwrap();
    pods_api(kube)
        .await
        .create(&Default::default(), &pod)
        .await
        .unwrap();
}

/// Waits for session `id` to fail, with `what` in its error.
async fn failed_saying(d: &Daemon, id: &str, env_log: &std::path::Path, what: &str) {
    let mut s = d.get(id).await;
    for _ in 0..600 {
        if s.status == pb::SessionStatus::Failed as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = d.get(id).await;
    }
    assert_eq!(
        status_name(s.status),
        "FAILED",
        "{}",
        std::fs::read_to_string(env_log).unwrap_or_default()
    );
    assert!(s.error_message.contains(what), "{s:?}");
}

/// The pod's processes killed (its node restarted them: the container restarts, its runner and
/// agent gone): the relay makes the pod ready again and the session fails saying the agent's
/// run is gone; a restart runs at once. Then the pod deleted outside paddock: the relay makes
/// it again from what paddock kept of it, and again a restart runs at once.
#[tokio::test]
async fn a_pod_that_lost_its_runner_or_was_deleted_is_made_ready_again() {
    let mut d = Daemon::start().await;
    let kube = FakeKube::start(&d.dirs.base.join("k"), &["agents"], &["paddock-agent"]);
    let mut req = d.request(Some(("long", long_turn(30, 100)))).await;
    pod_request(&mut req, options(&kube, &d.dirs.root));
    let id = d.create(req).await.id;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let pod = pod_of(&kube, &id).unwrap();
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let first_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let env_log = d
        .dirs
        .data
        .join("environments")
        .join(&id)
        .join("environment.log");
    let mut turn = d.start_turn(&id, "go").await;
    collect_until(&mut turn, |a| a.content == "step 2 of 30").await;
    kube.kill_pod_processes("agents", &name);
    failed_saying(&d, &id, &env_log, "is gone on pod agents/").await;
    let pod = pod_of(&kube, &id).unwrap();
    assert_eq!(pod["metadata"]["uid"], first_uid.as_str(), "the same pod");
    assert!(pod["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1));
    let log = std::fs::read_to_string(&env_log).unwrap();
    assert!(log.contains("making it ready again"), "{log}");
    crate::ssh::restart(&d, &id).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let mut turn = d.start_turn(&id, "again").await;
    within(collect_until(&mut turn, |a| kind(a) == "COMPLETION")).await;

    delete_outside_paddock(&kube, &name).await;
    failed_saying(&d, &id, &env_log, "is gone on pod agents/").await;
    let pod = pod_of(&kube, &id).expect("the pod made again");
    assert_ne!(pod["metadata"]["uid"], first_uid.as_str(), "a new pod");
    let log = std::fs::read_to_string(&env_log).unwrap();
    assert!(
        log.contains("is gone or has ended; making it again"),
        "{log}"
    );
    crate::ssh::restart(&d, &id).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let mut turn = d.start_turn(&id, "third").await;
    within(collect_until(&mut turn, |a| kind(a) == "COMPLETION")).await;
    // latis' prune deletes the finished session, and its pod with it.
    d.stop(&id, true).await.unwrap();
    d.wait_status(&id, pb::SessionStatus::Stopped).await;
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "prune"]).await;
    assert!(o.stdout.contains("Pruned 1 session(s)."), "{o:?}");
    within(async {
        while pod_of(&kube, &id).is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop(kube);
}
