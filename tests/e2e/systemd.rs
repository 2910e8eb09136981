//! The systemd user units paddock ships (`contrib/systemd/`): they pass `systemd-analyze
//! verify`, and the daemon takes the socket a service manager passes it (socket activation),
//! serves on it, and leaves it in place when it stops.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::cli::run;
use crate::harness::*;

fn units() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/systemd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_SYSTEMD").is_none(),
            "PADDOCK_REQUIRE_SYSTEMD is set but systemd-analyze is missing"
        );
        eprintln!("SKIPPED: systemd-analyze is not installed (apt-get install systemd)");
        return;
    }
    let dirs = Dirs::new();
    let unit_dir = dirs.base.join("units");
    std::fs::create_dir_all(&unit_dir).unwrap();
    for name in ["paddock.socket", "paddock.service"] {
        let text = std::fs::read_to_string(units().join(name)).unwrap();
        // The unit names ~/.cargo/bin/paddock; verify checks that the program exists, so it is
        // pointed at the binary under test.
        let text = text
            .lines()
            .map(|l| match l.strip_prefix("ExecStart=") {
                Some(rest) => format!("ExecStart={BIN} {}", rest.split_once(' ').unwrap().1),
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(unit_dir.join(name), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit_dir.join("paddock.socket"))
        .arg(unit_dir.join("paddock.service"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("paddock"), "warnings about the units: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_passed_by_the_service_manager_is_served_and_left_in_place() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.socket.parent().unwrap()).unwrap();
    // What systemd does for paddock.socket: bind, then start the daemon with the socket as fd
    // 3, LISTEN_FDS=1 and LISTEN_PID = the daemon's pid (`exec` keeps the shell's).
    let listener = std::os::unix::net::UnixListener::bind(&dirs.socket).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" daemon --socket \"$1\" --data-dir \"$2\"")
        .arg(BIN)
        .arg(&dirs.socket)
        .arg(&dirs.data)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &dirs.home)
        .env("PADDOCK_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe. dup2 clears close-on-exec on fd 3, but
    // onto itself it changes nothing: a listener that is fd 3 already (the lowest free one
    // when the test binds it) loses the flag by fcntl, or the daemon would find no socket.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 {
                nix::libc::fcntl(3, nix::libc::F_SETFD, 0)
            } else {
                nix::libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut daemon = cmd.spawn().unwrap();
    drop(listener);
    let o = run(dirs.cli(false), &["ping"]).await;
    if o.code != 0 {
        let _ = daemon.kill();
        let _ = daemon.wait();
        let mut log = String::new();
        let _ = std::io::Read::read_to_string(daemon.stderr.as_mut().unwrap(), &mut log);
        panic!("the daemon does not answer on the passed socket: {o:?}\ndaemon: {log}");
    }
    let o = run(dirs.cli(false), &["shutdown"]).await;
    assert_eq!(o.code, 0, "{o:?}");
    let status = daemon.wait().unwrap();
    let mut log = String::new();
    std::io::Read::read_to_string(daemon.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("socket activation"), "{log}");
    assert!(
        dirs.socket.exists(),
        "the service manager's socket is left in place"
    );
}
