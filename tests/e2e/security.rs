//! Who may use the daemon (reliability review D2, D3): the peer-credential check on every socket,
//! a socket directory another user could write to, a client that meets another user's socket,
//! and the modes of the data dir and the database.
//!
//! The tests that need a second user create one (`pdk-peer`, with `useradd`) and run the CLI as
//! that user with `setpriv`; where that cannot be done (not root, no `useradd`, the binary not
//! reachable by another user) they print why and return.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::harness::{Daemon, Dirs, BIN};

const PEER: &str = "pdk-peer";

/// The second user's uid, created once per test binary; `None` (with the reason printed) where
/// this machine cannot give us one.
fn peer_uid() -> Option<u32> {
    static UID: OnceLock<Result<u32, String>> = OnceLock::new();
    let uid = UID.get_or_init(|| {
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: cannot create a second user".into());
        }
        if nix::unistd::User::from_name(PEER).ok().flatten().is_none() {
            let out = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    PEER,
                ])
                .output()
                .map_err(|e| format!("useradd: {e}"))?;
            if !out.status.success() && nix::unistd::User::from_name(PEER).ok().flatten().is_none()
            {
                return Err(format!(
                    "useradd failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let user = nix::unistd::User::from_name(PEER)
            .ok()
            .flatten()
            .ok_or("the user useradd made is not found")?;
        // The binary must be reachable by that user (a checkout under a 0700 home is not).
        let probe = as_user(user.uid.as_raw()).arg("--version").output();
        match probe {
            Ok(o) if o.status.success() => Ok(user.uid.as_raw()),
            Ok(o) => Err(format!(
                "{} cannot run as {PEER}: {}",
                shared_binary().display(),
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => Err(format!("setpriv: {e}")),
        }
    });
    match uid {
        Ok(u) => Some(*u),
        // CI can create the user: there, not being able to is a failure, not a skip.
        Err(why) if std::env::var_os("PADDOCK_REQUIRE_SECOND_USER").is_some() => {
            panic!("a second user is required here: {why}")
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// A copy of the binary under test that any user can run: the checkout may sit under a home
/// directory others cannot enter (CI's clone is wherever CI puts it).
fn shared_binary() -> &'static Path {
    static COPY: OnceLock<std::path::PathBuf> = OnceLock::new();
    COPY.get_or_init(|| {
        // Copies left by earlier test runs (their process is gone) are removed.
        for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("pdk-e2e-bin-") {
                if pid
                    .parse()
                    .is_ok_and(|p: u32| !crate::harness::pid_running(p))
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = std::env::temp_dir().join(format!("pdk-e2e-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("paddock");
        std::fs::copy(BIN, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    })
}

/// `paddock` run as `uid` (its own group, no supplementary groups).
fn as_user(uid: u32) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(shared_binary())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    c
}

/// Opens the test's tempdir to everyone, as a careless install might, so that only the peer
/// check stands between the other user and the daemon.
fn open_up(dirs: &Dirs) {
    let mut p = dirs.socket.clone();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    while p.pop() && p.starts_with(&dirs.base) {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn ping_as(uid: u32, dirs: &Dirs) -> std::process::Output {
    as_user(uid)
        .arg("--socket")
        .arg(&dirs.socket)
        .arg("--no-autostart")
        .arg("ping")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_is_refused_even_on_a_world_writable_socket() {
    let Some(uid) = peer_uid() else { return };
    let d = Daemon::start().await;
    open_up(&d.dirs);
    let out = ping_as(uid, &d.dirs);
    assert!(
        !out.status.success(),
        "the other user got an answer: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The daemon says whom it turned away, and still serves its owner.
    let deadline = std::time::Instant::now() + crate::harness::WAIT;
    while !d
        .stderr()
        .contains("refused a connection from a user not allowed")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal logged: {}",
            d.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(d.stderr().contains(&uid.to_string()), "{}", d.stderr());
    let mut own = d.client().await;
    own.ping(paddock_proto::obey::local::v1::PingRequest {})
        .await
        .expect("the owner is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_user_is_served() {
    let Some(uid) = peer_uid() else { return };
    let d = Daemon::start_with(Dirs::new(), &["--allow-user", PEER]).await;
    open_up(&d.dirs);
    let out = ping_as(uid, &d.dirs);
    assert!(
        out.status.success(),
        "the allowed user was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A task the other user launches is that user's (Aria's user_id, from the connection's
    // credentials), not the daemon's.
    let out = as_user(uid)
        .arg("--socket")
        .arg(&d.dirs.socket)
        .args(["--no-autostart", "task", "launch", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut tasks = paddock_proto::aria::v1::task_service_client::TaskServiceClient::new(
        paddock::transport::channel(&d.dirs.socket).await.unwrap(),
    );
    let t = tasks
        .get_task(paddock_proto::aria::v1::GetTaskRequest { task_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.user_id, PEER, "{t:?}");
}

#[test]
fn a_socket_directory_another_user_owns_is_refused() {
    let Some(uid) = peer_uid() else { return };
    let dirs = Dirs::new();
    let dir = dirs.socket.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    nix::unistd::chown(dir, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
    let out = Daemon::daemon_command(
        &dirs,
        &dirs.socket,
        &dirs.data,
        std::process::Stdio::piped(),
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("owned by uid {uid}")) && err.contains("could replace the socket"),
        "{err}"
    );
    assert!(!dirs.socket.exists(), "nothing was bound there");
}

#[test]
fn a_world_writable_socket_directory_is_refused() {
    let dirs = Dirs::new();
    let dir = dirs.socket.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Daemon::daemon_command(
        &dirs,
        &dirs.socket,
        &dirs.data,
        std::process::Stdio::piped(),
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("others may write to it (mode 0777)"), "{err}");
}

#[test]
fn the_cli_sends_nothing_to_another_users_socket() {
    let Some(uid) = peer_uid() else { return };
    let dirs = Dirs::new();
    let dir = dirs.socket.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&dirs.socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    nix::unistd::chown(&dirs.socket, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
    let out = dirs.cli(false).arg("ping").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to talk to") && err.contains(&format!("uid {uid}")),
        "{err}"
    );
    assert!(
        listener.accept().is_err(),
        "the CLI connected to the impostor"
    );
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_and_database_are_private_and_old_installs_are_fixed() {
    let dirs = Dirs::new();
    // An older install: a 0755 data dir and a 0644 database.
    std::fs::create_dir_all(&dirs.data).unwrap();
    std::fs::set_permissions(&dirs.data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = dirs.data.join("paddock.db");
    std::fs::write(&db, "").unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let d = Daemon::start_in(dirs).await;
    assert_eq!(mode(&d.dirs.data), 0o700);
    for entry in std::fs::read_dir(&d.dirs.data).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("paddock.db") {
            assert_eq!(mode(&entry.path()), 0o600, "{name}");
        }
    }
}

/// What a server sends back to an HTTP/2 client preface, read by `/usr/bin/python3` run as
/// `uid` (empty: the connection was closed unanswered). `None` where no such Python exists.
fn h2_answer_as(uid: u32, socket: &Path) -> Option<Vec<u8>> {
    const PROBE: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    data = s.recv(64)
except OSError:  # refused: closed before or after the preface
    data = b""
sys.stdout.buffer.write(data)
"#;
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("skipped: no /usr/bin/python3 to probe the socket with");
        return None;
    }
    let out = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(python)
        .args(["-c", PROBE])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_serves_its_owner_only() {
    let Some(uid) = peer_uid() else { return };
    let d = Daemon::start().await;
    let runner = d.dirs.data.join("runner.sock");
    assert!(runner.exists(), "the daemon runs a runner by default");
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(&d.dirs.data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.dirs.base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let Some(owner) = h2_answer_as(nix::unistd::geteuid().as_raw(), &runner) else {
        return;
    };
    assert!(!owner.is_empty(), "the owner gets the server's SETTINGS");
    let other = h2_answer_as(uid, &runner).unwrap();
    assert!(other.is_empty(), "another user got {other:?}");
}

/// Reads every file of the data dir whose name starts with `paddock.db` (the database and its
/// journal files) as bytes.
fn database_bytes(data: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(data).unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("paddock.db")
        {
            all.extend(std::fs::read(entry.path()).unwrap());
        }
    }
    all
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_never_shown_and_not_stored_in_the_clear() {
    use paddock_proto::obey::local::v1 as pb;
    const CFG: &str = "sk-secret-CFG-5678";
    const ENV: &str = "sk-secret-ENV-1234";
    let mut d = Daemon::start().await;
    let mut req = d.request(None).await;
    req.provider_config.insert("api_key".into(), CFG.into());
    req.environment
        .insert("ANTHROPIC_API_KEY".into(), ENV.into());
    req.environment.insert("PLAIN".into(), "visible".into());
    let info = d.create(req).await;
    let id = info.id.clone();

    // Every reply shows the key and the mask, never the value.
    assert_eq!(info.provider_config["api_key"], paddock::secret::MASK);
    let got = d.get(&id).await;
    assert_eq!(got.provider_config["api_key"], paddock::secret::MASK);
    let list = d
        .client()
        .await
        .list_sessions(pb::ListSessionsRequest {
            include_terminated: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!format!("{list:?}").contains(CFG));
    for args in [
        vec!["--json", "session", "info", id.as_str()],
        vec!["--json", "session", "list", "--all"],
        vec!["session", "info", id.as_str()],
    ] {
        let out = d.dirs.cli(false).args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(CFG) && !text.contains(ENV),
            "{args:?}: {text}"
        );
    }

    // Sent back as shown, the mask keeps the stored credential.
    d.stop(&id, false).await.unwrap();
    d.wait_status(&id, pb::SessionStatus::Stopped).await;
    let restarted = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: id.clone(),
            provider_config: got.provider_config.clone(),
        })
        .await
        .expect("a restart with the masked settings")
        .into_inner();
    assert_eq!(
        restarted.session.unwrap().provider_config["api_key"],
        paddock::secret::MASK
    );

    // On disk: neither value in the database or its WAL; both open with the key file.
    let bytes = database_bytes(&d.dirs.data);
    assert!(!bytes.is_empty());
    assert!(!contains(&bytes, CFG) && !contains(&bytes, ENV));
    assert!(
        contains(&bytes, "visible"),
        "what is not a secret stays readable"
    );
    let data = d.dirs.data.clone();
    d.kill9();
    let store = paddock::store::Store::open(&data.join("paddock.db")).unwrap();
    let rec = store.session(&id).unwrap().unwrap();
    assert_eq!(rec.config.provider_config["api_key"], CFG);
    assert_eq!(rec.config.environment["ANTHROPIC_API_KEY"], ENV);
    assert_eq!(mode(&data.join(paddock::store::SECRET_KEY_FILE)), 0o600);
}

/// Review D1: a `script` that is a FIFO nobody writes to, or `/dev/zero`, once froze the daemon
/// or filled memory. Now each is refused at once (OBEY-2004), at create and at restart, and the
/// daemon keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_is_a_fifo_or_a_device_is_refused_at_once() {
    use paddock_proto::obey::local::v1 as pb;
    let mut d = Daemon::start().await;
    nix::unistd::mkfifo(
        &d.dirs.root.join("scripts/f.json"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.dirs.root.join("scripts/zero.json")).unwrap();
    let base = d.request(None).await;
    for (script, says) in [
        ("scripts/f.json", "is not a regular file"),
        ("/dev/zero", "relative to the campaign root"),
        ("scripts/zero.json", "outside the campaign root"),
        ("../../etc/passwd", "relative to the campaign root"),
    ] {
        let mut req = base.clone();
        req.provider_config.insert("script".into(), script.into());
        let started = std::time::Instant::now();
        let err = crate::harness::within(d.client().await.create_session(req))
            .await
            .expect_err(script);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{script}"
        );
        crate::harness::assert_status(&err, tonic::Code::FailedPrecondition, "OBEY-2004: ");
        assert!(err.message().contains(says), "{script}: {}", err.message());
    }
    // The same at restart, where the check runs in the daemon's loop: still answered at once.
    let s = d.session(None).await;
    d.stop(&s.id, false).await.unwrap();
    d.wait_status(&s.id, pb::SessionStatus::Stopped).await;
    let err = crate::harness::within(d.client().await.restart_session(pb::RestartSessionRequest {
        session_id: s.id.clone(),
        provider_config: [("script".to_string(), "scripts/f.json".to_string())].into(),
    }))
    .await
    .expect_err("a FIFO script at restart");
    assert!(
        err.message().contains("is not a regular file"),
        "{}",
        err.message()
    );
    d.client()
        .await
        .ping(pb::PingRequest {})
        .await
        .expect("the daemon still answers");
}
