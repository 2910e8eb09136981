//! The agent's built-in tools, confined to the working directory (the campaign root).
//!
//! | tool | input | does | result |
//! |---|---|---|---|
//! | `shell` | `command` | `/bin/sh -c command` in the root, stdin closed, stdout and stderr in one pipe | the output (capped), `[exit code N]` / `[timed out …]`; an error when not exit 0; a background job that keeps the pipe open is not waited for (2 s) |
//! | `read_file` | `path` | reads a file | its text (capped, lossy UTF-8) |
//! | `write_file` | `path`, `content` | creates or replaces a file (and its missing parent directories) | `wrote N bytes to path` |
//! | `list_dir` | `path` (default `.`) | lists a directory, sorted, `name/` for directories | one entry a line (capped) |
//!
//! **Confinement.** Every path goes through [`Tools::resolve`]: relative paths are taken from
//! the root; `..` is folded lexically and a path that then lies outside the root is refused
//! (`../x`, `/etc/passwd`); the deepest part of the path that exists is canonicalized, so a
//! symlink that leads outside (or dangles) is refused too; the tool then works on that
//! resolved path, never on the model's string. (A symlink swapped in between the check and the
//! use is not defended against: the model has a shell.)
//!
//! **The shell is not a sandbox**: a command can `cd /` like any shell. What confines it is the
//! session's permission policy (each call is asked first) and the process group: commands run
//! in the bridge's own group, so the daemon's TERM/KILL of a session reaches them. A timeout
//! kills the command and its descendants. `OPENAI_API_KEY` is removed from its environment, so
//! a command cannot print the key back to the model.

use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

// The names the core keeps client tools from taking.
pub const SHELL: &str = paddock_core::OWN_TOOLS[0];
pub const READ_FILE: &str = paddock_core::OWN_TOOLS[1];
pub const WRITE_FILE: &str = paddock_core::OWN_TOOLS[2];
pub const LIST_DIR: &str = paddock_core::OWN_TOOLS[3];

/// A directory listing shows at most this many entries: enough to orient, bounded.
const LIST_MAX: usize = 500;

/// The `tools` of a chat completions request: one JSON-schema function per tool.
pub fn definitions() -> Value {
    let f = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({"type": "function", "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required,
                           "additionalProperties": false},
        }})
    };
    let path = json!({"type": "string", "description": "a path relative to the working directory"});
    json!([
        f(SHELL, "Run a shell command (/bin/sh -c) in the working directory; returns its output (stdout and stderr) and exit code.",
          json!({"command": {"type": "string", "description": "the command line"}}), &["command"]),
        f(READ_FILE, "Read a text file in the working directory.", json!({"path": path}), &["path"]),
        f(WRITE_FILE, "Create or replace a file in the working directory with the given content.",
          json!({"path": path, "content": {"type": "string", "description": "the whole new content"}}), &["path", "content"]),
        f(LIST_DIR, "List a directory in the working directory (directories end with /).",
          json!({"path": {"type": "string", "description": "a directory relative to the working directory; default ."}}), &[]),
    ])
}

/// What a tool did, for the model and for the `TOOL_RESULT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub text: String,
    pub is_error: bool,
}

impl Outcome {
    fn ok(text: impl Into<String>) -> Outcome {
        Outcome {
            text: text.into(),
            is_error: false,
        }
    }
    pub fn error(text: impl Into<String>) -> Outcome {
        Outcome {
            text: text.into(),
            is_error: true,
        }
    }
}

/// Why a tool's path is refused: the tool's error result says it to the model.
#[derive(Debug, thiserror::Error)]
pub enum PathRefused {
    #[error("an empty path")]
    Empty,
    #[error("{raw}: outside the working directory")]
    Outside { raw: String },
    #[error("{raw}: {source} (a dangling symlink?)")]
    Unresolved {
        raw: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{raw}: leads outside the working directory (through a symlink)")]
    ThroughSymlink { raw: String },
}

/// The tools of one bridge.
#[derive(Debug, Clone)]
pub struct Tools {
    /// Canonical.
    root: PathBuf,
    /// A shell command is killed after this long.
    pub shell_timeout: Duration,
    /// Output a tool returns at most (bytes; more is cut with a marker).
    pub output_max: usize,
}

impl Tools {
    pub fn new(root: &Path, shell_timeout: Duration, output_max: usize) -> std::io::Result<Tools> {
        Ok(Tools {
            root: fs::canonicalize(root)?,
            shell_timeout,
            output_max,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Runs tool `name` with `input` (a JSON object). Never panics on the model's input: a
    /// bad input is an error [`Outcome`] the model can read and correct.
    pub fn run(&self, name: &str, input: &Value) -> Outcome {
        let arg = |k: &str| input.get(k).and_then(Value::as_str);
        let need = |k: &str| {
            arg(k).ok_or_else(|| Outcome::error(format!("{name}: missing string argument {k:?}")))
        };
        let r = match name {
            SHELL => need("command").map(|c| self.shell(c)),
            READ_FILE => need("path").map(|p| self.read_file(p)),
            WRITE_FILE => need("path").and_then(|p| Ok(self.write_file(p, need("content")?))),
            LIST_DIR => Ok(self.list_dir(arg("path").unwrap_or("."))),
            other => Err(Outcome::error(format!(
                "no tool named {other:?}: the tools are {SHELL}, {READ_FILE}, {WRITE_FILE}, {LIST_DIR}"
            ))),
        };
        r.unwrap_or_else(|e| e)
    }

    /// The real path `raw` names inside the root, or why it is refused.
    pub fn resolve(&self, raw: &str) -> Result<PathBuf, PathRefused> {
        if raw.trim().is_empty() {
            return Err(PathRefused::Empty);
        }
        let p = Path::new(raw);
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.root.join(p)
        };
        // Lexically first: `..` folded, so `a/../../x` is seen for what it is.
        let mut norm = PathBuf::new();
        for c in joined.components() {
            match c {
                Component::ParentDir => {
                    norm.pop();
                }
                Component::CurDir => {}
                c => norm.push(c),
            }
        }
        if !norm.starts_with(&self.root) {
            return Err(PathRefused::Outside { raw: raw.into() });
        }
        // Then physically: the deepest existing part, symlinks resolved.
        let mut existing = norm.clone();
        let mut missing = Vec::new();
        while fs::symlink_metadata(&existing).is_err() {
            match existing.file_name() {
                Some(n) => missing.push(n.to_os_string()),
                None => break,
            }
            existing.pop();
        }
        let real = fs::canonicalize(&existing).map_err(|source| PathRefused::Unresolved {
            raw: raw.into(),
            source,
        })?;
        if !real.starts_with(&self.root) {
            return Err(PathRefused::ThroughSymlink { raw: raw.into() });
        }
        Ok(missing.iter().rev().fold(real, |p, n| p.join(n)))
    }

    /// `path` as the model should see it: relative to the root.
    fn show(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }

    fn read_file(&self, raw: &str) -> Outcome {
        let path = match self.resolve(raw) {
            Ok(p) => p,
            Err(e) => return Outcome::error(e.to_string()),
        };
        let read = || -> std::io::Result<(Vec<u8>, u64)> {
            // Only regular files: opening a FIFO would block the agent until someone writes.
            let meta = fs::metadata(&path)?;
            if meta.is_dir() {
                return Err(std::io::Error::other("is a directory (use list_dir)"));
            }
            if !meta.is_file() {
                return Err(std::io::Error::other("is not a regular file"));
            }
            let f = fs::File::open(&path)?;
            let len = f.metadata()?.len();
            let mut buf = Vec::new();
            f.take(self.output_max as u64).read_to_end(&mut buf)?;
            Ok((buf, len))
        };
        match read() {
            Ok((buf, len)) => {
                let mut text = String::from_utf8_lossy(&buf).into_owned();
                if len > buf.len() as u64 {
                    text.push_str(&format!(
                        "\n[truncated: the file has {len} bytes, {} shown]",
                        buf.len()
                    ));
                }
                Outcome::ok(text)
            }
            Err(e) => Outcome::error(format!("{}: {e}", self.show(&path))),
        }
    }

    fn write_file(&self, raw: &str, content: &str) -> Outcome {
        let path = match self.resolve(raw) {
            Ok(p) => p,
            Err(e) => return Outcome::error(e.to_string()),
        };
        let write = || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            // Only regular files (or new ones): writing to a FIFO would block the agent.
            match fs::metadata(&path) {
                Ok(m) if !m.is_file() => {
                    return Err(std::io::Error::other("is not a regular file"))
                }
                _ => {}
            }
            fs::write(&path, content)
        };
        match write() {
            Ok(()) => Outcome::ok(format!(
                "wrote {} bytes to {}",
                content.len(),
                self.show(&path)
            )),
            Err(e) => Outcome::error(format!("{}: {e}", self.show(&path))),
        }
    }

    fn list_dir(&self, raw: &str) -> Outcome {
        let path = match self.resolve(raw) {
            Ok(p) => p,
            Err(e) => return Outcome::error(e.to_string()),
        };
        let entries = match fs::read_dir(&path) {
            Ok(d) => d,
            Err(e) => return Outcome::error(format!("{}: {e}", self.show(&path))),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| {
                let mut n = e.file_name().to_string_lossy().into_owned();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    n.push('/');
                }
                n
            })
            .collect();
        names.sort();
        let total = names.len();
        names.truncate(LIST_MAX);
        let mut text = names.join("\n");
        if total > LIST_MAX {
            text.push_str(&format!("\n[… and {} more]", total - LIST_MAX));
        }
        if total == 0 {
            text = "[empty directory]".into();
        }
        Outcome::ok(cap(text, self.output_max))
    }

    fn shell(&self, command: &str) -> Outcome {
        match self.spawn_shell(command) {
            Ok(o) => o,
            Err(e) => Outcome::error(format!("could not run /bin/sh: {e}")),
        }
    }

    fn spawn_shell(&self, command: &str) -> std::io::Result<Outcome> {
        let (mut reader, writer) = std::io::pipe()?;
        let (mut child, tag) = {
            // The Command holds our copies of the pipe's write end: dropped right after the
            // spawn, so the reader sees the end of the output when the command's side closes.
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(command)
                .current_dir(&self.root)
                .env_remove("OPENAI_API_KEY")
                .stdin(Stdio::null())
                .stdout(writer.try_clone()?)
                .stderr(writer);
            paddock_sys::proc::spawn_sync(&mut cmd)?
        };
        let max = self.output_max;
        // (kept bytes, total bytes seen), shared so that what came is there even if the pipe
        // never closes.
        let output: Arc<Mutex<(Vec<u8>, usize)>> = Arc::default();
        let sink = output.clone();
        let (done_tx, done) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            // Keep the first `max` bytes, count (and drop) the rest: the pipe must be drained
            // or a chatty command blocks on it forever.
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut o = sink.lock().unwrap_or_else(|e| e.into_inner());
                        o.1 += n;
                        let room = max.saturating_sub(o.0.len());
                        o.0.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
            let _ = done_tx.send(());
        });
        let deadline = Instant::now() + self.shell_timeout;
        let mut timed_out = false;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            if Instant::now() >= deadline {
                timed_out = true;
                // Its group and everything carrying its tag: a pipeline, a `make`, a `setsid`.
                paddock_sys::contain::kill_tree(child.id(), &tag);
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // A background job of the command may hold the pipe open: wait a little, not for it.
        let held_open = done
            .recv_timeout(paddock_sys::proc::DRAIN_AFTER_EXIT)
            .is_err();
        let (kept, total) = output.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut text = String::from_utf8_lossy(&kept).into_owned();
        if total > kept.len() {
            text.push_str(&format!(
                "\n[truncated: {} of {total} bytes of output shown]",
                kept.len()
            ));
        }
        if held_open {
            text.push_str("\n[a background process still holds the output open: not waited for]");
        }
        use std::os::unix::process::ExitStatusExt;
        let tail = if timed_out {
            Some(format!(
                "[timed out after {} s: killed]",
                self.shell_timeout.as_secs_f64()
            ))
        } else if let Some(sig) = status.signal() {
            Some(format!("[killed by signal {sig}]"))
        } else {
            match status.code() {
                Some(0) => None,
                Some(c) => Some(format!("[exit code {c}]")),
                None => Some("[exit status unknown]".into()),
            }
        };
        let is_error = tail.is_some();
        if let Some(t) = tail {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&t);
        }
        if text.is_empty() {
            text = "[no output]".into();
        }
        Ok(Outcome { text, is_error })
    }
}

/// `s` cut to at most `max` bytes (on a char boundary), with a marker.
fn cap(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let cut = s.floor_char_boundary(max);
    let dropped = s.len() - cut;
    s.truncate(cut);
    s.push_str(&format!("\n[truncated {dropped} bytes]"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> (tempfile::TempDir, Tools, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let root = base.join("root");
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("a.txt"), "alpha\n").unwrap();
        fs::write(base.join("secret.txt"), "secret\n").unwrap();
        let t = Tools::new(&root, Duration::from_secs(5), 1000).unwrap();
        (tmp, t, base)
    }

    #[test]
    fn paths_inside_the_root_resolve() {
        let (_tmp, t, base) = tools();
        let root = base.join("root");
        assert_eq!(t.resolve("a.txt").unwrap(), root.join("a.txt"));
        assert_eq!(t.resolve("./sub/../a.txt").unwrap(), root.join("a.txt"));
        assert_eq!(
            t.resolve("new/dir/f.txt").unwrap(),
            root.join("new/dir/f.txt")
        );
        assert_eq!(
            t.resolve(&root.join("sub").display().to_string()).unwrap(),
            root.join("sub")
        );
        assert_eq!(t.resolve(".").unwrap(), root);
    }

    #[test]
    fn escapes_are_refused() {
        let (_tmp, t, base) = tools();
        let root = base.join("root");
        std::os::unix::fs::symlink(&base, root.join("out")).unwrap();
        std::os::unix::fs::symlink(base.join("secret.txt"), root.join("leak.txt")).unwrap();
        std::os::unix::fs::symlink(base.join("nowhere.txt"), root.join("dangling")).unwrap();
        std::os::unix::fs::symlink(root.join("a.txt"), root.join("inner")).unwrap();
        for bad in [
            "../secret.txt",
            "sub/../../secret.txt",
            "/etc/passwd",
            &base.join("secret.txt").display().to_string(),
            "out/secret.txt",
            "out/new.txt",
            "leak.txt",
            "dangling",
            "",
        ] {
            assert!(t.resolve(bad).is_err(), "{bad:?} resolved");
        }
        // A symlink that stays inside is fine: the tool works on its target.
        assert_eq!(t.resolve("inner").unwrap(), root.join("a.txt"));

        // Through the tools: nothing is read or written outside.
        let o = t.run(WRITE_FILE, &json!({"path": "out/evil.txt", "content": "x"}));
        assert!(o.is_error && o.text.contains("outside"), "{o:?}");
        let o = t.run(WRITE_FILE, &json!({"path": "dangling", "content": "x"}));
        assert!(o.is_error, "{o:?}");
        let o = t.run(WRITE_FILE, &json!({"path": "../evil.txt", "content": "x"}));
        assert!(o.is_error, "{o:?}");
        assert!(!base.join("evil.txt").exists() && !base.join("nowhere.txt").exists());
        let o = t.run(READ_FILE, &json!({"path": "leak.txt"}));
        assert!(o.is_error && !o.text.contains("secret\n"), "{o:?}");
        let o = t.run(LIST_DIR, &json!({"path": ".."}));
        assert!(o.is_error, "{o:?}");
    }

    #[test]
    fn file_tools_work_and_cap_their_output() {
        let (_tmp, t, base) = tools();
        let root = base.join("root");
        let o = t.run(
            WRITE_FILE,
            &json!({"path": "deep/new.txt", "content": "hi\n"}),
        );
        assert_eq!(o, Outcome::ok("wrote 3 bytes to deep/new.txt"));
        assert_eq!(
            fs::read_to_string(root.join("deep/new.txt")).unwrap(),
            "hi\n"
        );
        assert_eq!(
            t.run(READ_FILE, &json!({"path": "deep/new.txt"})),
            Outcome::ok("hi\n")
        );
        assert_eq!(
            t.run(LIST_DIR, &json!({})),
            Outcome::ok("a.txt\ndeep/\nsub/")
        );
        fs::write(root.join("big.txt"), "x".repeat(5000)).unwrap();
        let o = t.run(READ_FILE, &json!({"path": "big.txt"}));
        assert!(
            o.text
                .ends_with("[truncated: the file has 5000 bytes, 1000 shown]"),
            "{}",
            o.text
        );
        assert!(t.run(READ_FILE, &json!({"path": "sub"})).is_error);
        assert!(t.run(READ_FILE, &json!({"path": "nope"})).is_error);
        let o = t.run(WRITE_FILE, &json!({"path": "x"}));
        assert_eq!(
            o,
            Outcome::error("write_file: missing string argument \"content\"")
        );
        assert!(t
            .run("rm_rf", &json!({}))
            .text
            .starts_with("no tool named \"rm_rf\""));
    }

    #[test]
    fn the_shell_runs_in_the_root_with_limits() {
        let (_tmp, mut t, base) = tools();
        let o = t.run(SHELL, &json!({"command": "pwd; echo err >&2"}));
        assert_eq!(
            o,
            Outcome::ok(format!("{}\nerr\n", base.join("root").display()))
        );
        let o = t.run(SHELL, &json!({"command": "echo no; exit 3"}));
        assert_eq!(o, Outcome::error("no\n[exit code 3]"));
        let o = t.run(SHELL, &json!({"command": "yes | head -c 100000"}));
        assert!(
            o.text
                .ends_with("[truncated: 1000 of 100000 bytes of output shown]"),
            "{}",
            o.text
        );
        assert!(!o.is_error);
        let o = t.run(SHELL, &json!({"command": "true"}));
        assert_eq!(o, Outcome::ok("[no output]"));
        // A background job holding the output: what came before is kept, the job not waited for.
        let bg = format!("sleep 4.{}", std::process::id());
        let t0 = Instant::now();
        let o = t.run(SHELL, &json!({"command": format!("echo hi; {bg} &")}));
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert_eq!(
            o,
            Outcome::ok("hi\n\n[a background process still holds the output open: not waited for]")
        );
        // A timeout kills the command and what it started.
        t.shell_timeout = Duration::from_millis(300);
        let marker = format!("sleep 7.{}", std::process::id());
        let t0 = Instant::now();
        let o = t.run(
            SHELL,
            &json!({"command": format!("echo start; setsid {marker} & {marker} | cat; echo never")}),
        );
        assert!(
            o.is_error && o.text.starts_with("start\n[timed out after 0.3 s"),
            "{o:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(100));
        let left = fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| {
                        String::from_utf8_lossy(&c)
                            .replace('\0', " ")
                            .contains(&marker)
                    })
                    .unwrap_or(false)
            })
            .count();
        assert_eq!(left, 0);
    }
}
