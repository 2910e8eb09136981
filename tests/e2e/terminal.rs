//! A terminal for the tests of interactive commands (`session attach`, `top`, confirmations):
//! a tmux server of the test's own, driven with send-keys and read with capture-pane.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

/// A tmux server of the test's own (its socket in the test's tempdir), killed on drop, pass or
/// fail.
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// None (and a note on stderr) when tmux is not installed.
    pub fn start(d: &Daemon) -> Option<Tmux> {
        let found = Command::new("tmux").arg("-V").output();
        if !matches!(&found, Ok(o) if o.status.success()) {
            // CI (.ci/run) installs tmux and sets this: there, a missing tmux is a failure,
            // not a pass that tested nothing.
            assert!(
                std::env::var_os("PADDOCK_REQUIRE_TMUX").is_none(),
                "tmux is not installed, and PADDOCK_REQUIRE_TMUX says the attach tests must run"
            );
            eprintln!("SKIPPED: tmux is not installed; the attach test needs a terminal (apt-get install tmux)");
            return None;
        }
        let t = Tmux {
            socket: d.dirs.base.join("tmux.sock"),
        };
        // A server with one idle window, so that it lives while panes come and go.
        t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "idle",
            "-x",
            "160",
            "-y",
            "50",
            "sleep 600",
        ]);
        Some(t)
    }

    pub fn run(&self, args: &[&str]) -> String {
        let o = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("run tmux");
        assert!(
            o.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Starts `paddock <args>` in a new 160×50 tmux session `name`, in the test's environment;
    /// the pane stays after it exits and shows its exit code.
    pub fn spawn(&self, d: &Daemon, name: &str, args: &[&str]) {
        self.spawn_sized(d, name, (160, 50), args)
    }

    /// [`Tmux::spawn`] in a terminal of `cols` × `rows`.
    pub fn spawn_sized(&self, d: &Daemon, name: &str, (cols, rows): (u16, u16), args: &[&str]) {
        let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
        let mut cmd = vec![
            "env".to_string(),
            "-i".into(),
            format!("PATH={}", quote(&std::env::var("PATH").unwrap_or_default())),
            format!("HOME={}", quote(&d.dirs.home.display().to_string())),
            "TERM=xterm-256color".into(),
            "PADDOCK_LOG=warn".into(),
            "PADDOCK_PROVIDER=scripted".into(),
            quote(BIN),
            "--no-autostart".into(),
            "--socket".into(),
            quote(&d.dirs.socket.display().to_string()),
            "--data-dir".into(),
            quote(&d.dirs.data.display().to_string()),
        ];
        cmd.extend(args.iter().map(|a| quote(a)));
        let line = format!("{}; echo \"[exit $?]\"; sleep 600", cmd.join(" "));
        self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
            &line,
        ]);
    }

    /// What pane `name` shows, each line without its trailing blanks (a line editor clears
    /// a row by writing spaces over it).
    pub fn screen(&self, name: &str) -> String {
        let s = self.run(&["capture-pane", "-p", "-J", "-S", "-200", "-t", name]);
        s.lines().map(str::trim_end).collect::<Vec<_>>().join("\n") + "\n"
    }

    pub fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// The terminal modes of pane `name` as `stty -a` names them (`icanon`, `-echo`, …).
    pub fn modes(&self, name: &str) -> Vec<String> {
        let tty = self.run(&["display-message", "-p", "-t", name, "#{pane_tty}"]);
        let o = Command::new("stty")
            .args(["-a", "-F", tty.trim()])
            .output()
            .expect("stty");
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// Types `text` literally, then Enter.
    pub fn type_line(&self, name: &str, text: &str) {
        self.run(&["send-keys", "-t", name, "-l", text]);
        self.keys(name, &["Enter"]);
    }

    /// Polls the pane until `pred` holds; the screen.
    pub async fn wait_for(&self, name: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.screen(name);
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "pane {name} never showed {what}; it shows:\n{s}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A screen without the line editor's empty prompt at its end: what was printed above it.
pub fn above_prompt(s: &str) -> &str {
    let s = s.trim_end();
    match s.rsplit_once('\n') {
        Some((above, ">")) => above.trim_end(),
        _ => s,
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}
