//! The ssh driver for real: an OpenSSH server (Debian's `openssh-server`, which `.ci/run`
//! installs) started by the test on 127.0.0.1 with a host key, a user key and a config of its
//! own. Sessions run whole turns in the paddock runner that provisioning starts "there"; the
//! ssh connection is killed mid-turn and the turn completes with every event once; bad
//! configurations (a port nobody answers on, a key the host does not know, a host key not in
//! known_hosts, a missing working directory) refuse the create with ssh's own words and leave
//! no session.
//!
//! The host is this machine (the same user, through sshd): what is "remote" is everything
//! paddock does through ssh — the binary copied, the runner started detached, the agent run
//! and relayed through a forwarded socket. The runner and its agents are stopped by the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aria::notification::EventPayload;
use paddock_proto::aria::v1 as aria;
use paddock_proto::obey::local::v1 as pb;
use serde_json::json;

use crate::environments::processes_with;
use crate::harness::*;

/// An sshd of the test's own, and what a client needs to reach it.
struct Sshd {
    child: Child,
    config: PathBuf,
    port: u16,
    user: String,
    /// The client's private key (its public half is authorized).
    key: PathBuf,
    /// A known_hosts file with the server's key.
    known_hosts: PathBuf,
    /// Where paddock keeps its binary and runner "on the host".
    remote_dir: PathBuf,
    dir: PathBuf,
}

/// A new ed25519 key pair at `path` (and `path`.pub), without a passphrase.
pub(crate) fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(st.success());
}

/// sshd in the foreground on `config`, logging to `dir/sshd.log`.
fn listen(config: &Path, dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sshd.log"))
        .unwrap();
    Command::new(sshd_program())
        .args(["-D", "-e", "-f"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start sshd")
}

fn sshd_program() -> PathBuf {
    ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("sshd is not installed: apt install openssh-server (.ci/run does)")
}

impl Sshd {
    async fn start(base: &Path) -> Sshd {
        let dir = base.join("sshd");
        std::fs::create_dir_all(&dir).unwrap();
        keygen(&dir.join("host_key"));
        keygen(&dir.join("user_key"));
        let authorized = dir.join("authorized_keys");
        std::fs::copy(dir.join("user_key.pub"), &authorized).unwrap();
        // sshd's privilege separation directory (made by its init script, which runs nowhere
        // here).
        let _ = std::fs::create_dir_all("/run/sshd");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n\
                 AllowStreamLocalForwarding yes\nLogLevel VERBOSE\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let child = listen(&config, &dir);
        let host_key = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
        let mut parts = host_key.split_whitespace();
        let known_hosts = dir.join("known_hosts");
        std::fs::write(
            &known_hosts,
            format!(
                "[127.0.0.1]:{port} {} {}\n",
                parts.next().unwrap(),
                parts.next().unwrap()
            ),
        )
        .unwrap();
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let s = Sshd {
            child,
            config,
            port,
            user,
            key: dir.join("user_key"),
            known_hosts,
            remote_dir: base.join("remote"),
            dir,
        };
        s.listening().await;
        s
    }

    async fn listening(&self) {
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("sshd did not listen: {}", self.log());
    }

    /// The host goes away for new connections (the listener ends; connections made stay).
    fn stop_listening(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The host is back, on the same port with the same keys.
    async fn listen_again(&mut self) {
        self.child = listen(&self.config, &self.dir);
        self.listening().await;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// The environment block of a session on this host, working in `workdir`.
    fn target(&self, workdir: &Path) -> pb::SshTarget {
        pb::SshTarget {
            host: "127.0.0.1".into(),
            port: u32::from(self.port),
            user: self.user.clone(),
            key_file: self.key.display().to_string(),
            known_hosts: self.known_hosts.display().to_string(),
            remote_dir: self.remote_dir.display().to_string(),
            workdir: workdir.display().to_string(),
            ..Default::default()
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The runner provisioning started "on the host", and whatever it still runs.
        for pid in processes_with(&self.remote_dir.display().to_string()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // The groups that runner made in the machine's cgroup tree.
        crate::harness::release_groups_under(&self.remote_dir);
    }
}

/// Creates with `req`, which must be refused saying `reason`.
pub(crate) async fn assert_refused(d: &Daemon, req: pb::CreateSessionRequest, reason: &str) {
    let e = d
        .client()
        .await
        .create_session(req)
        .await
        .expect_err("refused");
    assert!(e.message().contains(reason), "{reason}: {e:?}");
}

pub(crate) async fn restart(d: &Daemon, id: &str) {
    d.client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: id.to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// SIGKILLs the relays of the session whose environment directory is `env_dir` (here: the
/// agent there lives on).
fn kill_relays(env_dir: &Path) {
    for pid in processes_with(&format!("--dir={}", env_dir.display())) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn ssh_request(req: &mut pb::CreateSessionRequest, target: pb::SshTarget) {
    req.environment_spec = Some(pb::SessionEnvironment {
        driver: "ssh".into(),
        ssh: Some(target),
        ..Default::default()
    });
}

/// A turn ("again") started, the daemon SIGKILLed after its third step and started again: the
/// turn must end with every step of `want` once, and `last`.
pub(crate) async fn survive_a_daemon_kill(d: &mut Daemon, id: &str, want: &[String], last: &str) {
    let mut turn = d.start_turn(id, "again").await;
    let before = collect_until(&mut turn, |a| a.content == "step 3 of 30").await;
    d.kill9();
    d.launch().await;
    let mut w = d
        .client()
        .await
        .watch_activity(pb::WatchActivityRequest {
            session_id: id.to_string(),
            after_seq: before.last().unwrap().seq,
        })
        .await
        .unwrap()
        .into_inner();
    let after = within(collect_until(&mut w, |a| kind(a) == "COMPLETION")).await;
    let steps: Vec<&str> = before
        .iter()
        .chain(&after)
        .filter(|a| a.content.starts_with("step "))
        .map(|a| a.content.as_str())
        .collect();
    assert_eq!(steps, want);
    assert_eq!(after.last().unwrap().content, last);
}

/// A turn of `n` text steps, `ms` apart: long enough to cut the connection in its middle.
pub(crate) fn long_turn(n: usize, ms: u64) -> serde_json::Value {
    let mut steps: Vec<serde_json::Value> = (1..=n)
        .map(|i| json!({"text": format!("step {i} of {n}"), "delay_ms": ms, "tokens_in": 1, "tokens_out": 1}))
        .collect();
    steps.push(json!({"result": "All {turn} done: {message}"}));
    turns(json!(steps))
}

#[tokio::test]
async fn a_session_on_an_ssh_host_runs_whole_turns_through_a_dropped_connection() {
    let mut d = Daemon::start().await;
    let mut sshd = Sshd::start(&d.dirs.base).await;
    let mut req = d.request(Some(("long", long_turn(30, 100)))).await;
    ssh_request(&mut req, sshd.target(&d.dirs.root));
    let s = d.create(req).await;
    let id = s.id.clone();
    let info = d.wait_status(&id, pb::SessionStatus::Running).await;
    assert_eq!(
        info.environment_spec.as_ref().map(|e| e.driver.as_str()),
        Some("ssh")
    );
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "status", &id]).await;
    let want_driver = format!(
        "ssh (on {}@127.0.0.1:{}, in {} there",
        sshd.user,
        sshd.port,
        d.dirs.root.display()
    );
    assert!(o.stdout.contains(&want_driver), "{o:?}");
    // Provisioning copied this paddock there and started a runner of it there.
    let env_root = d.dirs.data.join("environments").join(&id);
    let log = std::fs::read_to_string(env_root.join("environment.log")).unwrap();
    assert!(log.contains("copied paddock"), "{log}");
    assert!(log.contains("runner on"), "{log}");
    let remote = sshd.remote_dir.display().to_string();
    let runners: Vec<u32> = processes_with(&remote)
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("runner")
        })
        .collect();
    assert!(!runners.is_empty(), "no runner under {remote}");
    // The agent is the copy's child there, not a child of the local runner.
    let copy = processes_with(&format!("{remote}/bin/paddock-"));
    assert!(
        copy.iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("__scripted-agent")
        }),
        "the scripted agent does not run from the copy: {copy:?}"
    );

    // A turn, its connection killed after a few steps while the host takes no new one: the
    // session is marked disconnected (GetSession, `session status`, an Aria notification)
    // until the host is back and the relay with it.
    let mut notes = crate::aria::notifications(&d).await;
    let mut turn = d.start_turn(&id, "go").await;
    let first = collect_until(&mut turn, |a| a.content == "step 5 of 30").await;
    let forward = format!("{}/ssh-", env_root.display());
    let cut = processes_with(&forward);
    assert!(!cut.is_empty(), "no ssh forward for {forward}");
    sshd.stop_listening();
    for pid in &cut {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    within(async {
        while !d.get(&id).await.disconnected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(status_name(d.get(&id).await.status), "WORKING");
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "status", &id]).await;
    assert!(
        o.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("connection:") && l.contains("lost: the agent")),
        "{o:?}"
    );
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "list"]).await;
    assert!(o.stdout.contains("working (disconnected)"), "{o:?}");
    let lost = |n: &aria::Notification| {
        matches!(&n.event_payload, Some(EventPayload::SessionStatus(s))
            if s.session_id == id && s.message.contains("was lost"))
    };
    within(collect_until(&mut notes, lost)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sshd.listen_again().await;
    let rest = within(collect_until(&mut turn, |a| kind(a) == "COMPLETION")).await;
    assert!(!d.get(&id).await.disconnected);
    let back = |n: &aria::Notification| {
        matches!(&n.event_payload, Some(EventPayload::SessionStatus(s))
            if s.session_id == id && s.message.contains("reconnected"))
    };
    within(collect_until(&mut notes, back)).await;
    let all: Vec<pb::SessionActivityEvent> = first.into_iter().chain(rest).collect();
    // Every step once, in order; the notes of the drop and the return; seqs strictly rising.
    let steps: Vec<&str> = all
        .iter()
        .filter(|a| a.content.starts_with("step "))
        .map(|a| a.content.as_str())
        .collect();
    let want: Vec<String> = (1..=30).map(|i| format!("step {i} of 30")).collect();
    assert_eq!(steps, want, "{all:#?}");
    let notes: Vec<&str> = all
        .iter()
        .filter(|a| kind(a) == "STATUS")
        .map(|a| a.content.as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("connection to") && n.contains("lost")),
        "{notes:?}"
    );
    assert!(notes.iter().any(|n| n.contains("reconnected")), "{notes:?}");
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "{all:#?}");
    assert_eq!(all.last().unwrap().content, "All 1 done: go");
    // What is stored is what was streamed: every step once.
    let mut w = d
        .client()
        .await
        .watch_activity(pb::WatchActivityRequest {
            session_id: id.clone(),
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let stored = collect_until(&mut w, |a| kind(a) == "COMPLETION").await;
    assert_eq!(
        stored.iter().map(|a| a.seq).collect::<Vec<_>>(),
        all.iter().map(|a| a.seq).collect::<Vec<_>>()
    );

    // The session goes on after the drop: a command run in it runs there, in the working
    // directory, as a run of the runner there.
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let o = crate::environments::exec_sh(&d, &id, "echo parent=$PPID; pwd").await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains(&d.dirs.root.display().to_string()),
        "{o:?}"
    );
    let parent: u32 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("parent="))
        .and_then(|p| p.trim().parse().ok())
        .expect("the parent's pid");
    assert!(
        runners.contains(&parent),
        "{parent} is not the runner there {runners:?}"
    );

    // The daemon killed mid-turn: the relay lives on in the local runner, the agent in the one
    // there; the restarted daemon takes the session back and the turn ends with every step once.
    survive_a_daemon_kill(&mut d, &id, &want, "All 2 done: again").await;

    // A stop ends the agent there, and the relay with its forward.
    d.stop(&id, true).await.unwrap();
    d.wait_status(&id, pb::SessionStatus::Stopped).await;
    let agents_there = || {
        processes_with(&format!("{remote}/bin/paddock-"))
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .unwrap_or_default()
                    .contains("__scripted-agent")
            })
            .count()
    };
    within(async {
        while agents_there() > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        processes_with(&forward).is_empty(),
        "the relay's forward outlived the stop"
    );
    drop(sshd);
}

#[tokio::test]
async fn bad_ssh_configurations_refuse_the_create_with_the_reason_and_leave_nothing() {
    let mut d = Daemon::start().await;
    let sshd = Sshd::start(&d.dirs.base).await;
    let root = d.dirs.root.clone();
    let other_key = d.dirs.base.join("stranger");
    keygen(&other_key);
    let empty_known = d.dirs.base.join("empty_known_hosts");
    std::fs::write(&empty_known, "").unwrap();
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cases: Vec<(pb::SshTarget, &str)> = vec![
        (
            pb::SshTarget {
                port: u32::from(closed_port),
                ..sshd.target(&root)
            },
            "Connection refused",
        ),
        (
            pb::SshTarget {
                key_file: other_key.display().to_string(),
                ..sshd.target(&root)
            },
            "--ssh-key",
        ),
        (
            pb::SshTarget {
                known_hosts: empty_known.display().to_string(),
                ..sshd.target(&root)
            },
            "Host key verification failed. (the host's key is not in",
        ),
        (
            sshd.target(&d.dirs.base.join("no-such-dir")),
            "there is no directory",
        ),
        (
            pb::SshTarget {
                host: String::new(),
                ..sshd.target(&root)
            },
            "needs a host",
        ),
    ];
    for (target, reason) in cases {
        let mut req = d.request(None).await;
        ssh_request(&mut req, target);
        assert_refused(&d, req, reason).await;
    }
    // The CLI's way, `--ssh USER@HOST:PORT --ssh-key FILE`: the host key is checked against
    // ssh's own known_hosts (the test HOME has none).
    let dest = format!("{}@127.0.0.1:{}", sshd.user, sshd.port);
    let key = sshd.key.display().to_string();
    let o = crate::latis::cli_in(
        &d,
        &root,
        &[
            "session",
            "create",
            "--ssh",
            &dest,
            "--ssh-key",
            &key,
            "--task",
            "t",
        ],
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("Host key verification failed"), "{o:?}");
    assert!(d.all_sessions().await.is_empty());
    // A host key seen for the first time is taken when asked (`accept-new`), and recorded.
    let fresh_known = d.dirs.base.join("fresh_known_hosts");
    let mut req = d.request(None).await;
    ssh_request(
        &mut req,
        pb::SshTarget {
            known_hosts: fresh_known.display().to_string(),
            accept_new_host_key: true,
            ..sshd.target(&root)
        },
    );
    let s = d.create(req).await;
    d.wait_status(&s.id, pb::SessionStatus::Running).await;
    assert!(std::fs::read_to_string(&fresh_known)
        .unwrap()
        .contains("ssh-ed25519"));
    d.stop(&s.id, true).await.unwrap();
    drop(sshd);
}

/// The runner there killed (as a host restart would): the agent is gone with it, the session
/// fails saying so, and the relay made the host ready again — a restart runs at once, in a
/// new runner there. Then the relay killed here: the agent there outlives it, and the
/// session's next start stops it before its own agent starts — or its delete does.
#[tokio::test]
async fn a_host_that_lost_its_runner_is_made_ready_again() {
    let mut d = Daemon::start().await;
    let sshd = Sshd::start(&d.dirs.base).await;
    let mut req = d.request(Some(("long", long_turn(30, 100)))).await;
    ssh_request(&mut req, sshd.target(&d.dirs.root));
    let id = d.create(req).await.id;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let remote = sshd.remote_dir.display().to_string();
    let runners = || -> Vec<u32> {
        processes_with(&remote)
            .into_iter()
            .filter(|p| {
                let c = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
                c.contains("runner") && c.contains("--socket")
            })
            .collect()
    };
    let before = runners();
    assert_eq!(before.len(), 1, "{before:?}");
    let mut turn = d.start_turn(&id, "go").await;
    collect_until(&mut turn, |a| a.content == "step 2 of 30").await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(before[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let env_log = d
        .dirs
        .data
        .join("environments")
        .join(&id)
        .join("environment.log");
    let mut failed = d.get(&id).await;
    for _ in 0..300 {
        if failed.status == pb::SessionStatus::Failed as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        failed = d.get(&id).await;
    }
    assert_eq!(
        status_name(failed.status),
        "FAILED",
        "{}",
        std::fs::read_to_string(&env_log).unwrap_or_default()
    );
    assert!(failed.error_message.contains("is gone on"), "{failed:?}");
    let now = runners();
    assert!(
        now.len() == 1 && now != before,
        "a new runner there: {before:?} -> {now:?}"
    );
    // A restart runs there at once.
    restart(&d, &id).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    let acts = d.send(&id, "again").await;
    // The agent is a new process: its first turn.
    assert_eq!(acts.last().unwrap().content, "All 1 done: again");

    // The relay killed here (as a forced stop's KILL would be while the connection is down):
    // the agent there runs on; the session's next start stops it before its own agent starts.
    let agents_there = || -> Vec<u32> {
        processes_with(&format!("{remote}/bin/paddock-"))
            .into_iter()
            .filter(|p| {
                let c = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
                // The agent there, not the relay here (whose command line names it too).
                c.contains("__scripted-agent") && !c.contains("__ssh-run")
            })
            .collect()
    };
    let mut turn = d.start_turn(&id, "long").await;
    collect_until(&mut turn, |a| a.content == "step 2 of 30").await;
    let left = agents_there();
    assert_eq!(left.len(), 1, "{left:?}");
    let env_dir = d.dirs.data.join("environments").join(&id);
    kill_relays(&env_dir);
    d.wait_status(&id, pb::SessionStatus::Failed).await;
    assert_eq!(agents_there(), left, "the agent there outlived its relay");
    restart(&d, &id).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    within(async {
        while agents_there().contains(&left[0]) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(agents_there().len(), 1, "only the new agent there");

    // Once more, and this time the session is deleted: the delete stops it there.
    let mut turn = d.start_turn(&id, "long").await;
    collect_until(&mut turn, |a| a.content == "step 2 of 30").await;
    kill_relays(&env_dir);
    d.wait_status(&id, pb::SessionStatus::Failed).await;
    assert_eq!(agents_there().len(), 1);
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "delete", "--yes", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    within(async {
        while !agents_there().is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop(sshd);
}
