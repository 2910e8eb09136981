//! A supervised process starts with every signal at its default action, whatever paddock itself
//! ignores: SIGPIPE (every Rust program ignores it) and what it was started ignoring (under
//! `nohup`, SIGHUP; a shell cannot trap a signal ignored when it started). Its own test binary:
//! the dispositions are the process's.

use paddock_sys::contain::{self, Role};

/// The `SigIgn` mask a child of ours reports for itself.
async fn ignored_by_a_child(cmd: tokio::process::Command) -> String {
    let (process, mut pipes) =
        paddock_sys::proc::spawn(cmd, false, contain::new_tag()).expect("spawn");
    let line = pipes.stdout.next_line().await.expect("a line");
    process.wait().await;
    String::from_utf8(line.bytes)
        .unwrap()
        .trim_end()
        .to_string()
}

#[tokio::test]
async fn a_supervised_process_ignores_nothing_paddock_ignores() {
    let data = tempfile::tempdir().unwrap();
    contain::set_owner(data.path(), Role::Daemon);
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler.
    unsafe { signal(Signal::SIGHUP, SigHandler::SigIgn) }.unwrap();
    let mut cmd = tokio::process::Command::new("grep");
    cmd.args(["SigIgn", "/proc/self/status"]);
    let line = ignored_by_a_child(cmd).await;
    // The control groups made for this program go with it (before a failed assertion too).
    contain::release();
    let mask = line.strip_prefix("SigIgn:\t").expect(&line);
    let mask = u64::from_str_radix(mask, 16).unwrap();
    // Bit n-1 is signal n; the standard signals are 1..=31 (32 and up are the C library's
    // and the real-time ones, which it keeps to itself).
    assert_eq!(
        mask & 0x7fff_ffff,
        0,
        "ignored: {mask:#x} (HUP is 0x1, PIPE 0x1000)"
    );
}
