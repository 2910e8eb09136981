//! Disk full (issue 15 point 8, review D11): the data dir is a 4 MiB tmpfs the test mounts
//! (root only; CI runs as root and sets `PADDOCK_REQUIRE_TMPFS`, so there a skip would be a
//! failure). Once the disk is full the daemon refuses new work with RESOURCE_EXHAUSTED
//! `OBEY-2050 … disk full`, answers reads, keeps its process and the agents, and once space is
//! freed it stores what waited and goes on, having lost nothing it acknowledged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;
use tonic::Code;

use crate::harness::*;

/// A small tmpfs mounted on `at` for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("mounting a tmpfs needs root".into());
        }
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0700"))
            .arg("tmpfs")
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }

    /// Gives it `size` (a tmpfs grows in place).
    fn grow(&self, size: &str) {
        let st = std::process::Command::new("mount")
            .args(["-o"])
            .arg(format!("remount,size={size}"))
            .arg(&self.0)
            .status()
            .expect("mount -o remount");
        assert!(st.success(), "remounting the tmpfs with size={size}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system holding `dir` until it refuses another byte.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // Smaller writes take what the last chunk did not.
    while f.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_new_work_and_loses_nothing() {
    full_disk(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_new_work_and_loses_nothing_without_the_runner() {
    full_disk(&["--no-runner"]).await;
}

/// A daemon whose disk filled after one turn of a session, waiting to store a 1 MiB message.
struct Full {
    // Fields drop in this order: the daemon before its file system.
    d: Daemon,
    fs: Tmpfs,
    s: pb::SessionInfo,
    before: Vec<pb::SessionActivityEvent>,
    filler: PathBuf,
    /// The held message's turn, as its client sees it.
    held: Held,
}

/// [`Full`], once the daemon refuses a create with `OBEY-2050` (`None`: no tmpfs here, and
/// none is required).
async fn fill_up(args: &[&str]) -> Option<Full> {
    let dirs = Dirs::new();
    let fs = match Tmpfs::mount(&dirs.data, "4m") {
        Ok(fs) => fs,
        Err(why) if std::env::var_os("PADDOCK_REQUIRE_TMPFS").is_some() => {
            panic!("a tmpfs is required here: {why}")
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            return None;
        }
    };
    let mut d = Daemon::start_with(dirs, args).await;
    let s = d.session(None).await;
    let before = d.send(&s.id, "before the disk fills").await;
    assert!(!before.is_empty());

    let filler = fill(&fs.0);
    // A 1 MiB message cannot be stored: the commit fails and the daemon waits for space.
    // Its answer waits with it (nothing is acknowledged before it is stored).
    let held = hold(&d, &s.id, "m".repeat(1024 * 1024)).await;
    // New work is refused at once, with the reason.
    let mut refused = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let req = d.request(None).await;
        match within(d.client().await.create_session(req)).await {
            Err(e) => {
                refused = Some(e);
                break;
            }
            // Stored before the disk was full enough to refuse it: try again.
            Ok(_) => continue,
        }
    }
    let e = refused.expect("a create refused while the disk is full");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("OBEY-2050: disk full"), "{e:?}");
    Some(Full {
        fs,
        d,
        s,
        before,
        filler,
        held,
    })
}

async fn full_disk(args: &[&str]) {
    let Some(Full {
        fs,
        mut d,
        s,
        before,
        filler,
        held,
    }) = fill_up(args).await
    else {
        return;
    };
    // Reads are answered, the daemon and the agent are alive.
    d.client()
        .await
        .ping(pb::PingRequest {})
        .await
        .expect("ping");
    let now = d.get(&s.id).await;
    assert!(now.pid > 0);
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(now.pid as i32), None).is_ok(),
        "the agent lives"
    );
    assert!(
        !held.is_finished(),
        "the 1 MiB message is not acknowledged yet"
    );

    // Space is back: what waited is stored and answered, and new work is taken again. The
    // filler alone may free less than the held 1 MiB message, its 1 MiB answer and their
    // checkpoint need (the WAL was as large as it could grow when the disk filled), and a
    // daemon that fills the disk again rightly waits again: the file system grows too.
    std::fs::remove_file(&filler).unwrap();
    fs.grow("64m");
    answered_and_stored(&mut d, &s.id, before.len(), held).await;
    drop(d);
}

/// A message's turn that the daemon holds while it cannot store it (its answer waits with it).
pub(crate) type Held =
    tokio::task::JoinHandle<Result<Vec<pb::SessionActivityEvent>, tonic::Status>>;

/// Sends `message` to session `id` in a task of its own.
pub(crate) async fn hold(d: &Daemon, id: &str, message: String) -> Held {
    let client = d.client().await;
    let id = id.to_string();
    tokio::spawn(async move {
        let stream = client
            .clone()
            .send_message(pb::SendMessageRequest {
                session_id: id,
                message,
            })
            .await?
            .into_inner();
        Ok::<_, tonic::Status>(collect_ok(stream).await)
    })
}

/// Once the daemon can store again: the held turn is answered to its end, new work is taken,
/// and session `id` has every acknowledged activity stored once, in order (`before` of them
/// before the held turn).
pub(crate) async fn answered_and_stored(d: &mut Daemon, id: &str, before: usize, held: Held) {
    let acts = tokio::time::timeout(Duration::from_secs(30), held)
        .await
        .expect("the held message is answered once the daemon can store again")
        .unwrap()
        .expect("the held message's turn");
    assert_eq!(
        acts.last().unwrap().r#type,
        pb::ActivityType::Completion as i32,
        "{acts:?}"
    );
    // Bounded: a create the daemon holds would otherwise hang the suite.
    within(d.session(None)).await;
    let stored = d.stored_activities(id).await;
    assert_eq!(
        stored.len(),
        before + acts.len(),
        "every acknowledged activity is stored"
    );
    let seqs: Vec<i64> = stored.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, (1..=stored.len() as i64).collect::<Vec<_>>());
}

/// A SIGTERM ends a daemon that waits for space (it used to wait on), and loses nothing it
/// acknowledged: the held message was never answered, so never stored, and the next daemon
/// finds the session as the last commit left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_waiting_for_space_exits_on_sigterm_and_loses_nothing() {
    let Some(mut f) = fill_up(&[]).await else {
        return;
    };
    let d = &mut f.d;
    let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = d.wait_exit(Duration::from_secs(15)).await;
    assert!(!st.success(), "it could not store its last batch: {st}");
    assert!(
        d.stderr()
            .contains("asked to shut down while the disk is full"),
        "{}",
        d.stderr()
    );
    // Refused or cut off (a stream error panics `collect_ok`), never answered.
    let answer = tokio::time::timeout(Duration::from_secs(5), f.held)
        .await
        .expect("the held message's client is let go");
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "never acknowledged: {answer:?}"
    );

    std::fs::remove_file(&f.filler).unwrap();
    f.fs.grow("64m");
    d.launch().await;
    let stored = d.stored_activities(&f.s.id).await;
    let seqs: Vec<i64> = stored.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, (1..=f.before.len() as i64).collect::<Vec<_>>());
}
