//! The one process library: every process paddock supervises is started, read, signalled and
//! reaped here — agents in `--no-runner` mode and tasks (`daemon::supervisor`), the runner's
//! runs (`runner::process`), and output rebuilt into lines wherever it arrives in chunks (the
//! runner's stream in `daemon::runner_link`, a bridge's agent in `providers::bridge`).
//!
//! - [`spawn`]: in a process group of its own (TERM / KILL go to the whole group), with
//!   `PR_SET_PDEATHSIG(SIGKILL)` (it dies with the thread that forked it, so with its parent),
//!   in a control group of its own where one can be made (born there: `born.rs`; moved
//!   there before its exec where the kernel cannot), and with a containment tag
//!   ([`crate::contain`]); [`Process::wait`] reports the exit only
//!   after the tree the process leaves behind is killed.
//! - [`Output`]: a pipe that ends at EOF or once it stayed silent for [`DRAIN_AFTER_EXIT`]
//!   after the process exited (a grandchild holding it open), so every byte the process
//!   printed is read before its exit is reported, and nothing waits forever.
//! - [`LineSplitter`]: bytes in chunks → lines of at most [`LINE_BYTES_MAX`], the cut counted;
//!   driven by [`Output::next_line`], by [`BlockingLines`] (plain threads) and by callers that
//!   receive chunks themselves.
//! - [`StderrTail`]: the last [`STDERR_TAIL_LINES`] lines of stderr, each at most
//!   [`STDERR_LINE_BYTES_MAX`], for the reason of a failed exit.
//!
//! Architecture Invariant: nothing else in the shell calls `pre_exec`, `process_group` or
//! `killpg` for a supervised process.

use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use std::task::Poll;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

/// Longest output line of a supervised process kept whole; the rest of a longer line is
/// dropped and counted ([`Line::cut_bytes`]). Agents print large tool results on one line;
/// 4 MiB bounds the memory one line can take (and keeps a runner `ExecEvent`, which carries
/// its line at most three times, under the runner's 16 MiB event limit).
pub const LINE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Lines of stderr kept for the reason of a failed exit.
pub const STDERR_TAIL_LINES: usize = 20;
/// Bytes kept of one such line.
pub const STDERR_LINE_BYTES_MAX: usize = 512;
/// After a process exited, how long its pipes may stay silent (a process it left behind
/// holding them open) before they are taken as ended.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// Bytes asked for in one read of a pipe.
const READ_BYTES: usize = 64 * 1024;

/// What to run: an agent's launch, as a provider plans it.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
}

impl LaunchPlan {
    /// The command for this plan (program, arguments, environment, directory).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .current_dir(&self.cwd)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }
}

/// Waits for the signal that asks a server (the daemon, the runner) to stop: SIGINT or
/// SIGTERM, whichever comes first. Never returns if the handlers cannot be installed (the
/// server then runs until it is killed, as it would without them).
pub async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {},
        _ = term.recv() => {},
    }
}

/// Signals the process group `pgid` leads (nothing for 0, which would be our own group).
pub fn signal_group(pgid: u32, signal: paddock_core::Signal) {
    if pgid == 0 {
        return;
    }
    let sig = match signal {
        paddock_core::Signal::Hup => nix::sys::signal::Signal::SIGHUP,
        paddock_core::Signal::Term => nix::sys::signal::Signal::SIGTERM,
        paddock_core::Signal::Kill => nix::sys::signal::Signal::SIGKILL,
    };
    if let Err(e) = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), sig) {
        tracing::debug!(pgid, ?sig, "killpg: {e}");
    }
}

/// How a process ended: its exit code, or the signal that killed it (both `None` if it could
/// not be waited for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl From<&std::io::Result<std::process::ExitStatus>> for Exit {
    fn from(status: &std::io::Result<std::process::ExitStatus>) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match status {
            Ok(s) => Exit {
                code: s.code(),
                signal: s.signal(),
            },
            Err(_) => Exit::default(),
        }
    }
}

/// Starts `cmd` supervised: stdin piped when `stdin` (else `/dev/null`: an open stdin makes
/// `codex exec` wait for a prompt forever), stdout and stderr piped, in a process group of its
/// own, with the parent-death signal, and carrying `tag` ([`crate::contain::TAG_VAR`]).
///
/// The parent-death signal fires when the *thread* that forked exits: call this from a task on
/// a runtime worker thread (which lives as long as the process), never from `spawn_blocking`.
pub fn spawn(mut cmd: Command, stdin: bool, tag: String) -> std::io::Result<(Process, Pipes)> {
    if let Some(owner) = crate::contain::owner() {
        cmd.env(crate::contain::OWNER_VAR, owner);
    }
    cmd.env(crate::contain::TAG_VAR, &tag)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    let parent = nix::unistd::getpid();
    let cgroup = crate::contain::tree_cgroup(&tag);
    if let Some(group) = &cgroup {
        // Born in the tree's control group, where the kernel can (see `crate::born`).
        if CLONE_INTO_CGROUP.load(Ordering::Relaxed) {
            use std::os::fd::AsFd;
            match crate::born::spawn(cmd.as_std(), stdin, group.dir.as_fd(), parent) {
                Ok(born) => return Process::born(born, tag),
                Err(crate::born::Error::Failed(e)) => {
                    crate::contain::forget_tree(&tag);
                    return Err(e);
                }
                Err(crate::born::Error::Unsupported(e)) => {
                    tracing::info!("cannot clone into a control group ({e}): moving instead");
                    CLONE_INTO_CGROUP.store(false, Ordering::Relaxed);
                }
            }
        }
    }
    // SAFETY: the closure runs in the forked child before exec and only calls write, prctl,
    // getppid and signal, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // Into the tree's control group before anything else runs: whatever it starts is
            // born there. A failed move leaves the tree its tag.
            if let Some(group) = &cgroup {
                let _ = crate::contain::cgroup::enter(&group.procs);
            }
            die_with(parent)
        });
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            crate::contain::forget_tree(&tag);
            return Err(e);
        }
    };
    let pid = child.id().unwrap_or(0);
    let (exited_tx, exited) = watch::channel(false);
    let pipes = Pipes {
        stdin: child.stdin.take(),
        stdout: Output::new(
            child.stdout.take().expect("stdout is piped"),
            exited.clone(),
        ),
        stderr: Output::new(child.stderr.take().expect("stderr is piped"), exited),
    };
    let process = Process {
        pid,
        child: Child::Forked(child),
        tag,
        exited: exited_tx,
    };
    Ok((process, pipes))
}

/// Whether this kernel clones into a control group (until it said it does not).
static CLONE_INTO_CGROUP: AtomicBool = AtomicBool::new(true);

/// For code on plain threads (the openai-api bridge's tool commands): starts `cmd` in a process
/// group of its own, carrying a new containment tag, which it returns, and killed if the thread
/// that started it dies ([`die_with_parent`]). On a timeout [`crate::contain::kill_tree`] with
/// the child's pid and that tag ends the command and everything it started, `setsid`ed
/// children included.
pub fn spawn_sync(
    cmd: &mut std::process::Command,
) -> std::io::Result<(std::process::Child, String)> {
    use std::os::unix::process::CommandExt;
    let tag = crate::contain::new_tag();
    cmd.env(crate::contain::TAG_VAR, &tag).process_group(0);
    die_with_parent(cmd);
    Ok((cmd.spawn()?, tag))
}

/// Makes the process `cmd` starts die (SIGKILL) with the thread that starts it, as every
/// process [`spawn`] starts does: a bridge's agent does not outlive a bridge that was killed.
/// The thread must outlive the child (it waits for it, or lives as long as the program): the
/// kernel's "parent death" is the death of that thread.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, getppid
    // and signal, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || die_with(parent));
    }
}

/// In a forked child, before exec: SIGKILL when the thread that forked it dies, and every
/// signal's default action ([`crate::born::default_dispositions`]). Only calls prctl, getppid
/// and signal (async-signal-safe).
fn die_with(parent: nix::unistd::Pid) -> std::io::Result<()> {
    crate::born::default_dispositions();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(std::io::Error::from)?;
    // The parent died between fork and prctl: the signal will never come.
    if nix::unistd::getppid() != parent {
        return Err(std::io::Error::other("the parent exited"));
    }
    Ok(())
}

/// A supervised process, to wait for.
#[derive(Debug)]
pub struct Process {
    /// Its pid, which is also its process group's id.
    pub pid: u32,
    child: Child,
    tag: String,
    exited: watch::Sender<bool>,
}

/// How a process was started, hence how it is waited for.
#[derive(Debug)]
enum Child {
    /// By tokio (std's fork and exec).
    Forked(tokio::process::Child),
    /// Born in its control group ([`crate::born`]), waited for on its pidfd.
    Born(PidFd),
}

impl Process {
    /// A process [`crate::born`] started, with its pipes.
    fn born(b: crate::born::Born, tag: String) -> std::io::Result<(Process, Pipes)> {
        let (exited_tx, exited) = watch::channel(false);
        let pid = b.pid;
        // The child is ours from here: a failure below still waits for it.
        let child = PidFd::new(pid, b.pidfd);
        let pipes = (|| {
            Ok::<_, std::io::Error>(Pipes {
                stdin: b
                    .stdin
                    .map(|fd| ChildStdin::from_std(std::process::ChildStdin::from(fd)))
                    .transpose()?,
                stdout: Output::new(
                    ChildStdout::from_std(std::process::ChildStdout::from(b.stdout))?,
                    exited.clone(),
                ),
                stderr: Output::new(
                    ChildStderr::from_std(std::process::ChildStderr::from(b.stderr))?,
                    exited,
                ),
            })
        })();
        let process = Process {
            pid,
            child: Child::Born(child),
            tag,
            exited: exited_tx,
        };
        match pipes {
            Ok(pipes) => Ok((process, pipes)),
            Err(e) => {
                signal_group(pid, paddock_core::Signal::Kill);
                Err(e)
            }
        }
    }

    /// Waits for the process to exit, then kills what it left behind: its group and every
    /// process carrying its tag (a process is its whole tree, as systemd's control-group kill
    /// mode has it). From then on its pipes count down [`DRAIN_AFTER_EXIT`].
    pub async fn wait(mut self) -> Exit {
        let exit = match &mut self.child {
            Child::Forked(child) => {
                let status = child.wait().await;
                if let Err(e) = &status {
                    tracing::warn!(pid = self.pid, "wait: {e}");
                }
                Exit::from(&status)
            }
            Child::Born(child) => child.wait().await,
        };
        let (pgid, tag) = (self.pid, self.tag);
        crate::contain::end_tree(pgid, tag).await;
        let _ = self.exited.send(true);
        exit
    }
}

/// A child waited for on its pidfd (readable once it exited), reaped with `waitid(P_PIDFD)`.
/// One dropped before its exit is reaped on a thread of its own, never left a zombie.
#[derive(Debug)]
struct PidFd {
    pid: u32,
    /// `None` once reaped.
    fd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// The descriptor, when the runtime would not watch it (then waited for on a thread).
    unwatched: Option<std::os::fd::OwnedFd>,
}

impl PidFd {
    fn new(pid: u32, fd: std::os::fd::OwnedFd) -> PidFd {
        // SAFETY: an OwnedFd: its descriptor is valid, stays open and is the same for as long
        // as the AsyncFd owns it.
        let watched = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        match watched {
            Ok(fd) => PidFd {
                pid,
                fd: Some(fd),
                unwatched: None,
            },
            Err(e) => {
                let (fd, e) = e.into_parts();
                // Not expected (a pidfd polls); the wait then blocks a thread.
                tracing::warn!(pid, "cannot watch the pidfd: {e}");
                PidFd {
                    pid,
                    fd: None,
                    unwatched: Some(fd),
                }
            }
        }
    }

    async fn wait(&mut self) -> Exit {
        use std::os::fd::AsFd;
        if let Some(fd) = &self.fd {
            while let Ok(mut ready) = fd.readable().await {
                if let Some(exit) = waitid_pidfd(fd.get_ref().as_fd(), true) {
                    self.fd = None;
                    return exit;
                }
                ready.clear_ready();
            }
        }
        // Not watched (or the watch failed): waited for on a blocking thread.
        let (pid, fd) = (self.pid, self.take());
        tokio::task::spawn_blocking(move || reap(pid, fd.as_ref().map(|f| f.as_fd())))
            .await
            .unwrap_or_default()
    }

    /// The descriptor of a child not reaped yet.
    fn take(&mut self) -> Option<std::os::fd::OwnedFd> {
        let watched = self.fd.take().map(|f| f.into_inner());
        watched.or(self.unwatched.take())
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        if let Some(fd) = self.take() {
            let pid = self.pid;
            let _ = std::thread::Builder::new()
                .name("paddock-reap".into())
                .spawn(move || {
                    use std::os::fd::AsFd;
                    reap(pid, Some(fd.as_fd()))
                });
        }
    }
}

/// The exit of the child behind `fd`, once it exited (`None` while it runs, when `nohang`).
fn waitid_pidfd(fd: std::os::fd::BorrowedFd<'_>, nohang: bool) -> Option<Exit> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let mut flags = WaitPidFlag::WEXITED;
    if nohang {
        flags |= WaitPidFlag::WNOHANG;
    }
    loop {
        return match waitid(Id::PIDFd(fd), flags) {
            Ok(WaitStatus::StillAlive) => None,
            Ok(status) => Some(Exit::from(status)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("waitid: {e}");
                Some(Exit::default())
            }
        };
    }
}

impl From<nix::sys::wait::WaitStatus> for Exit {
    fn from(status: nix::sys::wait::WaitStatus) -> Self {
        use nix::sys::wait::WaitStatus;
        match status {
            WaitStatus::Exited(_, code) => Exit {
                code: Some(code),
                signal: None,
            },
            WaitStatus::Signaled(_, sig, _) => Exit {
                code: None,
                signal: Some(sig as i32),
            },
            _ => Exit::default(),
        }
    }
}

/// Blocks until the child exits and reaps it (by its pidfd, else by its pid).
fn reap(pid: u32, fd: Option<std::os::fd::BorrowedFd<'_>>) -> Exit {
    match fd {
        Some(fd) => waitid_pidfd(fd, false).unwrap_or_default(),
        None => nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None)
            .map(Exit::from)
            .unwrap_or_default(),
    }
}

/// A supervised process's pipes.
#[derive(Debug)]
pub struct Pipes {
    /// `None` unless [`spawn`] was asked for a piped stdin.
    pub stdin: Option<ChildStdin>,
    pub stdout: Output<ChildStdout>,
    pub stderr: Output<ChildStderr>,
}

/// One output pipe of a supervised process. It ends at EOF, or once it stayed silent for
/// [`DRAIN_AFTER_EXIT`] after the process exited; data already in the pipe always wins.
#[derive(Debug)]
pub struct Output<R> {
    pipe: R,
    exited: watch::Receiver<bool>,
    // No read buffer of its own: see `read`.
    lines: LineQueue,
    ended: bool,
}

impl<R: AsyncRead + Unpin> Output<R> {
    fn new(pipe: R, exited: watch::Receiver<bool>) -> Self {
        Output {
            pipe,
            exited,
            lines: LineQueue::new(LINE_BYTES_MAX),
            ended: false,
        }
    }

    /// The next chunk of bytes (at most 64 KiB), or `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Vec<u8>> {
        let bytes = self.read().await;
        (!bytes.is_empty()).then_some(bytes)
    }

    /// Reads lines of at most `max` bytes instead of [`LINE_BYTES_MAX`] (before the first read).
    pub fn with_line_limit(mut self, max: usize) -> Self {
        self.lines = LineQueue::new(max);
        self
    }

    /// The next line (a last one without `\n` included), or `None` at the end.
    pub async fn next_line(&mut self) -> Option<Line> {
        loop {
            if let Some(line) = self.lines.ready() {
                return line;
            }
            let bytes = self.read().await;
            self.lines.push(&bytes);
        }
    }

    /// One read of at most [`READ_BYTES`]: what it read, nothing at the end.
    ///
    /// The read goes into a buffer on the polling thread's stack, and what it read is copied
    /// out at its size: a pipe waiting for output holds no buffer. (A buffer of its own, even
    /// one starting at 4 KiB, cost 8 KiB of resident memory per agent in the runner, its
    /// stdout's and its stderr's, measured with 1,000 agents; 64 KiB ones cost 36 KiB.)
    async fn read(&mut self) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        let exited = &mut self.exited;
        let drained = async {
            if exited.wait_for(|e| *e).await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(DRAIN_AFTER_EXIT).await;
        };
        let pipe = &mut self.pipe;
        let read = std::future::poll_fn(|cx| {
            // A local of this call, not of the future: it does not outlive the poll.
            let mut space = [std::mem::MaybeUninit::<u8>::uninit(); READ_BYTES];
            let mut buf = ReadBuf::uninit(&mut space);
            match std::pin::Pin::new(&mut *pipe).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => Poll::Ready(buf.filled().to_vec()),
                Poll::Ready(Err(_)) => Poll::Ready(Vec::new()),
                Poll::Pending => Poll::Pending,
            }
        });
        let bytes = tokio::select! {
            biased;
            bytes = read => bytes,
            _ = drained => Vec::new(),
        };
        self.ended = bytes.is_empty();
        bytes
    }
}

/// One line of output, without its `\n` (nor a `\r` before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// At most the splitter's limit.
    pub bytes: Vec<u8>,
    /// Bytes of the line dropped beyond the limit.
    pub cut_bytes: usize,
    /// Where the line ended in the chunk that completed it: the offset just after its `\n`
    /// (the chunk's length for a last line without one).
    pub end: usize,
}

impl Line {
    /// The line as text (invalid UTF-8 replaced), with the cut marked as [`truncate`] does.
    pub fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        if self.cut_bytes == 0 {
            text.into_owned()
        } else {
            format!("{text}{}", cut_marker(self.cut_bytes))
        }
    }
}

/// Splits a byte stream into lines, keeping at most `max` bytes of each (the count of bytes
/// dropped comes with the line). Lines lose their `\n` (and a `\r` before it).
#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    line: Vec<u8>,
    cut: usize,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            line: Vec::new(),
            cut: 0,
        }
    }

    /// Feeds one chunk; the lines it completes go to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Line>) {
        let mut start = 0;
        while start < data.len() {
            let (part, end, complete) = match memchr::memchr(b'\n', &data[start..]) {
                Some(i) => (&data[start..start + i], start + i + 1, true),
                None => (&data[start..], data.len(), false),
            };
            let room = self.max.saturating_sub(self.line.len());
            let keep = part.len().min(room);
            self.line.extend_from_slice(&part[..keep]);
            self.cut += part.len() - keep;
            if complete {
                self.emit(end, out);
            }
            start = end;
        }
    }

    /// Feeds one chunk of text (already UTF-8: the runner's `CommandOutput`); the lines it
    /// completes go to `out` as they are. A line wholly inside `data` is lent from it, not
    /// copied, and is text without a check: `data` is split only at `\n`. A line begun in an
    /// earlier chunk is the one copied; one past the limit is cut at a character boundary,
    /// its cut marked as [`Line::text`] marks it. Not to be mixed with [`LineSplitter::feed`]
    /// on one splitter (a line it began may end inside a character).
    pub fn feed_text<'a>(&mut self, data: &'a str, out: &mut Vec<TextLine<'a>>) {
        let mut start = 0;
        while start < data.len() {
            let (part, end, complete) = match memchr::memchr(b'\n', &data.as_bytes()[start..]) {
                Some(i) => (&data[start..start + i], start + i + 1, true),
                None => (&data[start..], data.len(), false),
            };
            start = end;
            if complete && self.line.is_empty() && self.cut == 0 && part.len() <= self.max {
                let text = part.strip_suffix('\r').unwrap_or(part);
                out.push(TextLine {
                    text: std::borrow::Cow::Borrowed(text),
                    end,
                });
                continue;
            }
            // Once cut, a line takes nothing more (a character's worth of room may be left).
            let room = match self.cut {
                0 => self.max.saturating_sub(self.line.len()),
                _ => 0,
            };
            let keep = part.floor_char_boundary(part.len().min(room));
            self.line.extend_from_slice(&part.as_bytes()[..keep]);
            self.cut += part.len() - keep;
            if complete {
                out.push(self.emit_text(end));
            }
        }
    }

    fn emit_text(&mut self, end: usize) -> TextLine<'static> {
        let mut line = Line {
            bytes: std::mem::take(&mut self.line),
            cut_bytes: std::mem::take(&mut self.cut),
            end,
        };
        if line.cut_bytes == 0 && line.bytes.last() == Some(&b'\r') {
            line.bytes.pop();
        }
        TextLine {
            text: std::borrow::Cow::Owned(line.text()),
            end,
        }
    }

    /// End of input: a last line without `\n`.
    pub fn finish(&mut self, out: &mut Vec<Line>) {
        if !self.line.is_empty() || self.cut > 0 {
            let end = self.line.len();
            self.emit(end, out);
        }
    }

    /// Forgets a partial line (output before it was lost).
    pub fn reset(&mut self) {
        self.line.clear();
        self.cut = 0;
    }

    fn emit(&mut self, end: usize, out: &mut Vec<Line>) {
        let mut bytes = std::mem::take(&mut self.line);
        if self.cut == 0 && bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        out.push(Line {
            bytes,
            cut_bytes: std::mem::take(&mut self.cut),
            end,
        });
    }
}

/// One line of text from [`LineSplitter::feed_text`]: without its `\n` (nor a `\r` before
/// it), the cut marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextLine<'a> {
    pub text: std::borrow::Cow<'a, str>,
    /// Where the line ended in the chunk that completed it: the offset just after its `\n`.
    pub end: usize,
}

/// Lines split from chunks as they come, waiting to be taken.
#[derive(Debug)]
struct LineQueue {
    split: LineSplitter,
    lines: VecDeque<Line>,
    ended: bool,
}

impl LineQueue {
    fn new(max: usize) -> Self {
        LineQueue {
            split: LineSplitter::new(max),
            lines: VecDeque::new(),
            ended: false,
        }
    }

    /// A line, or `Some(None)` when none will come any more; `None` when it needs a chunk.
    fn ready(&mut self) -> Option<Option<Line>> {
        match self.lines.pop_front() {
            Some(line) => Some(Some(line)),
            None => self.ended.then_some(None),
        }
    }

    /// Feeds one chunk; an empty one is the end of input.
    fn push(&mut self, chunk: &[u8]) {
        let mut lines = Vec::new();
        if chunk.is_empty() {
            self.ended = true;
            self.split.finish(&mut lines);
        } else {
            self.split.feed(chunk, &mut lines);
        }
        self.lines.extend(lines);
    }
}

/// Lines of a blocking reader (for plain threads), at most `max` bytes each; a read error
/// ends them.
pub struct BlockingLines<R> {
    r: R,
    buf: Box<[u8]>,
    lines: LineQueue,
}

impl<R: Read> BlockingLines<R> {
    pub fn new(r: R, max: usize) -> Self {
        BlockingLines {
            r,
            buf: vec![0; READ_BYTES].into_boxed_slice(),
            lines: LineQueue::new(max),
        }
    }
}

impl<R: Read> Iterator for BlockingLines<R> {
    type Item = Line;

    fn next(&mut self) -> Option<Line> {
        loop {
            if let Some(line) = self.lines.ready() {
                return line;
            }
            let n = self.r.read(&mut self.buf).unwrap_or(0);
            self.lines.push(&self.buf[..n]);
        }
    }
}

/// The last [`STDERR_TAIL_LINES`] lines of a stderr, each at most [`STDERR_LINE_BYTES_MAX`].
#[derive(Debug)]
pub struct StderrTail {
    split: LineSplitter,
    lines: VecDeque<String>,
}

impl Default for StderrTail {
    fn default() -> Self {
        StderrTail {
            split: LineSplitter::new(STDERR_LINE_BYTES_MAX),
            lines: VecDeque::new(),
        }
    }
}

impl StderrTail {
    /// Reads `stderr` to its end; the tail.
    pub async fn read<R: AsyncRead + Unpin>(mut stderr: Output<R>) -> String {
        let mut tail = StderrTail::default();
        while let Some(chunk) = stderr.next_chunk().await {
            tail.feed(&chunk);
        }
        tail.text()
    }

    /// Feeds one chunk of stderr.
    pub fn feed(&mut self, data: &[u8]) {
        let mut lines = Vec::new();
        self.split.feed(data, &mut lines);
        self.keep(lines);
    }

    /// The tail so far (a last line without `\n` included), lines joined by `\n`.
    pub fn text(&mut self) -> String {
        let mut lines = Vec::new();
        self.split.finish(&mut lines);
        self.keep(lines);
        self.lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn keep(&mut self, lines: Vec<Line>) {
        for line in lines {
            if self.lines.len() == STDERR_TAIL_LINES {
                self.lines.pop_front();
            }
            self.lines.push_back(line.text().trim_end().to_string());
        }
    }
}

/// `s` cut to at most `max` bytes (at a character boundary), the cut marked.
pub fn truncate(s: &str, max: usize) -> String {
    let head = crate::text::prefix(s, max);
    if head.len() == s.len() {
        return s.to_string();
    }
    format!("{head}{}", cut_marker(s.len() - head.len()))
}

/// How a cut is marked where text was dropped.
pub fn cut_marker(cut_bytes: usize) -> String {
    format!("… [{cut_bytes} bytes cut]")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        let t = truncate("ééé", 3);
        assert!(t.starts_with('é'));
        assert!(t.contains("bytes cut"));
    }

    #[test]
    fn lines_are_split_bounded_and_counted() {
        let mut s = LineSplitter::new(5);
        let mut out = Vec::new();
        s.feed(b"ab", &mut out);
        s.feed(b"c\r\nhello world\nx", &mut out);
        s.finish(&mut out);
        let got: Vec<_> = out
            .iter()
            .map(|l| (&l.bytes[..], l.cut_bytes, l.end))
            .collect();
        assert_eq!(
            got,
            vec![
                (&b"abc"[..], 0, 3),
                (&b"hello"[..], 6, 15),
                (&b"x"[..], 0, 1)
            ]
        );
        assert_eq!(out[1].text(), "hello… [6 bytes cut]");
        let mut out = Vec::new();
        s.finish(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn text_lines_are_lent_when_whole_and_cut_at_a_character() {
        let mut s = LineSplitter::new(5);
        let mut out = Vec::new();
        s.feed_text("ab", &mut out);
        assert!(out.is_empty());
        s.feed_text("c\r\nhi\r\n\nhello world\néééé\nx", &mut out);
        let got: Vec<_> = out
            .iter()
            .map(|l| (l.text.as_ref(), matches!(l.text, Cow::Borrowed(_)), l.end))
            .collect();
        assert_eq!(
            got,
            vec![
                // Begun in the chunk before: copied.
                ("abc", false, 3),
                ("hi", true, 7),
                ("", true, 8),
                ("hello… [6 bytes cut]", false, 20),
                // Five bytes would split the third `é`.
                ("éé… [4 bytes cut]", false, 29),
            ]
        );
        let mut out = Vec::new();
        s.feed_text("y\n", &mut out);
        assert_eq!(
            out,
            vec![TextLine {
                text: Cow::Owned("xy".into()),
                end: 2
            }]
        );
    }

    #[test]
    fn blocking_lines_are_bounded() {
        let mut input = vec![b'x'; LINE_BYTES_MAX + 10];
        input.extend_from_slice(b"\nnext\nlast");
        let lines: Vec<_> = BlockingLines::new(&input[..], LINE_BYTES_MAX).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].bytes.len(), LINE_BYTES_MAX);
        assert_eq!(lines[0].cut_bytes, 10);
        assert_eq!(lines[1].text(), "next");
        assert_eq!(lines[2].text(), "last");
    }

    #[test]
    fn the_stderr_tail_keeps_the_last_lines_each_bounded() {
        let mut tail = StderrTail::default();
        for i in 0..STDERR_TAIL_LINES + 5 {
            tail.feed(format!("line {i}\n").as_bytes());
        }
        tail.feed(&[b'y'; STDERR_LINE_BYTES_MAX + 1]);
        let text = tail.text();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), STDERR_TAIL_LINES);
        assert_eq!(lines[0], "line 6");
        assert!(lines[STDERR_TAIL_LINES - 1].ends_with("… [1 bytes cut]"));
    }

    /// A process is reaped with its tree, its whole output read before its exit is known, and
    /// a pipe a leftover holds open ends after the drain period.
    #[tokio::test]
    async fn spawn_reads_everything_and_ends_the_tree() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo one; echo oops >&2; setsid sleep 600 & echo two; exit 3",
        ]);
        let tag = crate::contain::new_tag();
        let (process, mut pipes) = spawn(cmd, false, tag.clone()).unwrap();
        assert!(pipes.stdin.is_none());
        let stderr = tokio::spawn(StderrTail::read(pipes.stderr));
        let exit = process.wait().await;
        assert_eq!(
            exit,
            Exit {
                code: Some(3),
                signal: None
            }
        );
        let mut lines = Vec::new();
        while let Some(l) = pipes.stdout.next_line().await {
            lines.push(l.text());
        }
        assert_eq!(lines, ["one", "two"]);
        assert_eq!(stderr.await.unwrap(), "oops");
        assert!(crate::contain::tagged_processes(std::path::Path::new("/proc"), &tag).is_empty());
    }

    /// A busy pipe is read 64 KiB at a time, and every byte arrives; lines are whole.
    #[tokio::test]
    async fn a_busy_pipe_is_read_64_kib_at_a_time_and_lines_come_whole() {
        let (_tx, exited) = watch::channel(false);
        let busy = vec![b'x'; 1 << 20];
        let mut out = Output::new(&busy[..], exited.clone());
        let mut sizes = Vec::new();
        while let Some(chunk) = out.next_chunk().await {
            sizes.push(chunk.len());
        }
        assert_eq!(sizes, [READ_BYTES; 16]);
        assert_eq!(sizes.iter().sum::<usize>(), busy.len());

        let quiet = b"one line\n".repeat(100);
        let mut out = Output::new(&quiet[..], exited);
        let mut lines = 0;
        while out.next_line().await.is_some() {
            lines += 1;
        }
        assert_eq!(lines, 100);
    }

    #[test]
    fn a_process_dies_with_the_thread_that_started_it() {
        use std::os::unix::process::ExitStatusExt;
        let (tx, rx) = std::sync::mpsc::channel();
        // The starting thread ends at once, leaving its child behind.
        std::thread::spawn(move || {
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("30");
            die_with_parent(&mut cmd);
            tx.send(cmd.spawn().unwrap()).unwrap();
        })
        .join()
        .unwrap();
        let mut child = rx.recv().unwrap();
        let t0 = std::time::Instant::now();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "{status:?}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }
}
