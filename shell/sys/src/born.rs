//! A supervised process born in its tree's control group: `clone3(CLONE_INTO_CGROUP)`.
//!
//! Moving a process into a cgroup (a write to `cgroup.procs`, what [`crate::proc::spawn`]'s
//! child did before exec) takes the write side of the kernel's global
//! `cgroup_threadgroup_rwsem`, which waits for an RCU grace period: 10–20 ms per spawn, measured
//! on a 2-vCPU VM, on the critical path of every session's start and every task. A process
//! *created* in the group (Linux 5.7, cgroup2) takes the read side only: 0.1–0.3 ms there.
//! So where the tree has a group, [`spawn`] clones the child straight into it, with a pidfd
//! (`CLONE_PIDFD`) to wait on, and the child does what `std::process::Command` would before its
//! exec: its pipes on 0, 1 and 2, a process group of its own, the parent-death signal, the
//! working directory, the default signal mask and dispositions, `execve` (and, for a file the
//! kernel will not run, a script without `#!`, `/bin/sh` with it, as `execvp` does).
//!
//! The child runs between `clone3` and `execve` in a copy of a multi-threaded parent: it calls
//! only async-signal-safe functions and allocates nothing (every string it needs is made
//! before the clone). A failure there is reported through a close-on-exec pipe (its `errno`),
//! as std does; a kernel without `clone3` or `CLONE_INTO_CGROUP` makes no child at all, and the
//! caller falls back to std's spawn with the old move ([`Error::Unsupported`]).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::libc;

/// In a child between fork (or clone) and exec: every signal back to its default action.
/// An exec resets the signals a program handles but keeps the ones it ignores, and a program
/// may not undo that: a shell cannot trap a signal ignored when it started. Ignored here are
/// SIGPIPE (Rust ignores it in its own programs) and whatever paddock itself was started
/// ignoring (under `nohup`, SIGHUP: an agent's shell would never hear a HUP sent to it).
/// Calls only `signal`, which is async-signal-safe; KILL and STOP cannot be changed.
pub(crate) fn default_dispositions() {
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: SIG_DFL installs no handler.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

/// `CLONE_INTO_CGROUP` (linux/sched.h; not in every libc crate version).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` as of Linux 5.7 (linux/sched.h, `CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// A child [`spawn`] started: its pid, a pidfd to wait on, its pipes' parent ends.
#[derive(Debug)]
pub(crate) struct Born {
    pub pid: u32,
    pub pidfd: OwnedFd,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Why [`spawn`] started nothing.
#[derive(Debug)]
pub(crate) enum Error {
    /// This kernel cannot clone into a group (no `clone3`, no `CLONE_INTO_CGROUP`, a group it
    /// refuses): no child was made; spawn the other way.
    Unsupported(io::Error),
    /// The command cannot start (no such program, not executable, no such directory, …).
    Failed(io::Error),
}

/// What the child needs, made before the clone: it allocates nothing.
struct Prepared {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: Option<CString>,
}

impl Prepared {
    fn of(cmd: &std::process::Command) -> io::Result<Prepared> {
        let cstr = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the command")
            })
        };
        // The environment as std would give it: ours, with the command's changes.
        let mut env: std::collections::BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => env.insert(k.to_os_string(), v.to_os_string()),
                None => env.remove(k),
            };
        }
        let cwd = cmd.get_current_dir();
        let program = resolve(cmd.get_program(), env.get(OsStr::new("PATH")), cwd)?;
        let mut argv = vec![cstr(cmd.get_program())?];
        for a in cmd.get_args() {
            argv.push(cstr(a)?);
        }
        let envp = env
            .into_iter()
            .map(|(mut k, v)| {
                k.push("=");
                k.push(v);
                cstr(&k)
            })
            .collect::<io::Result<_>>()?;
        Ok(Prepared {
            program: cstr(program.as_os_str())?,
            argv,
            envp,
            cwd: cwd.map(|d| cstr(d.as_os_str())).transpose()?,
        })
    }
}

/// The file `program` names: as given when it has a `/` (relative to the child's working
/// directory, as `execve` after its `chdir` would take it), else the first executable file of
/// that name in `path` (the child's PATH, as `execvp` searches it).
fn resolve(program: &OsStr, path: Option<&OsString>, cwd: Option<&Path>) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return Ok(match cwd {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p,
        });
    }
    let path = path
        .cloned()
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|f| {
            std::fs::metadata(f).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// Starts `cmd` (its program, arguments, environment changes and working directory; nothing
/// else of it is read) in the control group whose directory is `cgroup`: stdin a pipe when
/// `stdin` (else `/dev/null`), stdout and stderr pipes, a process group of its own, and
/// SIGKILL when the thread that calls this dies (`parent` is this process, checked after the
/// `prctl` as [`crate::proc`] does).
pub(crate) fn spawn(
    cmd: &std::process::Command,
    stdin: bool,
    cgroup: BorrowedFd<'_>,
    parent: nix::unistd::Pid,
) -> Result<Born, Error> {
    let p = Prepared::of(cmd).map_err(Error::Failed)?;
    // The null-terminated arrays execve takes.
    let pointers = |strings: &[CString]| -> Vec<*const libc::c_char> {
        let mut v: Vec<_> = strings.iter().map(|s| s.as_ptr()).collect();
        v.push(std::ptr::null());
        v
    };
    let (argv, envp) = (pointers(&p.argv), pointers(&p.envp));
    // A file the kernel will not run (a script without `#!`) is the shell's to read, as
    // `execvp` does it: `/bin/sh program args…`.
    let sh_argv: Vec<*const libc::c_char> = [SHELL.as_ptr(), p.program.as_ptr()]
        .into_iter()
        .chain(argv[1..].iter().copied())
        .collect();
    let cwd = p.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let (in_r, in_w) = if stdin {
        let (r, w) = pipe().map_err(Error::Failed)?;
        (r, Some(w))
    } else {
        let null = std::fs::File::open("/dev/null").map_err(Error::Failed)?;
        (OwnedFd::from(null), None)
    };
    let (out_r, out_w) = pipe().map_err(Error::Failed)?;
    let (err_r, err_w) = pipe().map_err(Error::Failed)?;
    let (report_r, report_w) = pipe().map_err(Error::Failed)?;
    let child_fds = [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
    let report = report_w.as_raw_fd();
    let parent = parent.as_raw();

    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP | libc::CLONE_PIDFD as u64,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM forks this process. The child (0) runs only `child`,
    // which calls async-signal-safe functions on memory made before the clone and never
    // returns; the parent goes on as after a fork.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        // SAFETY: see above; every pointer is valid in the child's copy of the memory.
        unsafe {
            child(
                &child_fds,
                parent,
                cwd,
                &Exec {
                    program: p.program.as_ptr(),
                    argv: &argv,
                    sh_argv: &sh_argv,
                    envp: &envp,
                },
                report,
            )
        }
    }
    if pid < 0 {
        return Err(Error::Unsupported(io::Error::last_os_error()));
    }
    let pid = pid as libc::pid_t;
    // SAFETY: CLONE_PIDFD stored a new descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((in_r, out_w, err_w, report_w));
    // The report pipe closes on the child's exec; before that, it says why it failed.
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match nix::unistd::read(&report_r, &mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    if got == errno.len() {
        // It exited (127): reaped here.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(Error::Failed(io::Error::from_raw_os_error(
            i32::from_ne_bytes(errno),
        )));
    }
    Ok(Born {
        pid: pid as u32,
        pidfd,
        stdin: in_w,
        stdout: out_r,
        stderr: err_r,
    })
}

/// What the child executes, made before the clone: NUL-terminated strings and
/// null-terminated arrays of them.
struct Exec<'a> {
    program: *const libc::c_char,
    argv: &'a [*const libc::c_char],
    /// `/bin/sh program args…`, for a file the kernel will not run.
    sh_argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
}

/// The child, between the clone and its exec. Never returns.
///
/// # Safety
/// Only in the child of [`spawn`]'s clone; the pointers are NUL-terminated strings and
/// null-terminated arrays made before the clone.
unsafe fn child(
    fds: &[libc::c_int; 3],
    parent: libc::pid_t,
    cwd: *const libc::c_char,
    exec: &Exec<'_>,
    report: libc::c_int,
) -> ! {
    let fail = |report: libc::c_int| -> ! {
        let errno = *libc::__errno_location();
        let bytes = errno.to_ne_bytes();
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    };
    // Signals as a new program expects them: none blocked, none ignored.
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
        fail(report);
    }
    default_dispositions();
    for (target, &fd) in fds.iter().enumerate() {
        let target = target as libc::c_int;
        if fd == target {
            // Already there: only its close-on-exec flag goes.
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                fail(report);
            }
        } else if libc::dup2(fd, target) < 0 {
            fail(report);
        }
    }
    if libc::setpgid(0, 0) < 0 {
        fail(report);
    }
    if libc::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        0,
        0,
        0,
    ) < 0
    {
        fail(report);
    }
    // The parent died between the clone and the prctl: the signal will never come.
    if libc::getppid() != parent {
        *libc::__errno_location() = libc::ESRCH;
        fail(report);
    }
    if !cwd.is_null() && libc::chdir(cwd) < 0 {
        fail(report);
    }
    libc::execve(exec.program, exec.argv.as_ptr(), exec.envp.as_ptr());
    if *libc::__errno_location() == libc::ENOEXEC {
        libc::execve(SHELL.as_ptr(), exec.sh_argv.as_ptr(), exec.envp.as_ptr());
        // No shell: the file's own failure is the one to tell.
        *libc::__errno_location() = libc::ENOEXEC;
    }
    fail(report)
}

/// The shell that runs a file the kernel cannot ([`spawn`]).
const SHELL: &std::ffi::CStr = c"/bin/sh";

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// This test's own control group: a child may always be born where its parent is.
    fn own_group() -> std::fs::File {
        let dir = crate::contain::cgroup::own_cgroup().expect("a cgroup2 hierarchy");
        std::fs::File::open(dir).unwrap()
    }

    fn run(cmd: &std::process::Command, stdin: bool) -> Result<Born, Error> {
        use std::os::fd::AsFd;
        spawn(cmd, stdin, own_group().as_fd(), nix::unistd::getpid())
    }

    fn read_all(fd: OwnedFd) -> String {
        let mut s = String::new();
        std::fs::File::from(fd).read_to_string(&mut s).unwrap();
        s
    }

    fn exit_of(b: &Born) -> nix::sys::wait::WaitStatus {
        use std::os::fd::AsFd;
        nix::sys::wait::waitid(
            nix::sys::wait::Id::PIDFd(b.pidfd.as_fd()),
            nix::sys::wait::WaitPidFlag::WEXITED,
        )
        .unwrap()
    }

    #[test]
    fn a_child_is_born_in_the_group_with_its_pipes_group_directory_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "read line; echo \"$line $KEPT ${HOME:-none}\"; pwd; \
             echo oops >&2; cat /proc/self/cgroup | grep '^0::'; ps -o pgid= -p $$; exit 3",
        ])
        .env("KEPT", "yes")
        .env_remove("HOME")
        .current_dir(dir.path());
        let b = run(&cmd, true).unwrap_or_else(|e| panic!("{e:?}"));
        let mut stdin = std::fs::File::from(b.stdin.as_ref().unwrap().try_clone().unwrap());
        stdin.write_all(b"hello\n").unwrap();
        drop(stdin);
        let pid = b.pid;
        let Born { stdout, stderr, .. } = &b;
        let out = read_all(stdout.try_clone().unwrap());
        let err = read_all(stderr.try_clone().unwrap());
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("hello yes none"), "{out}");
        assert_eq!(
            lines.next().map(PathBuf::from),
            Some(dir.path().canonicalize().unwrap())
        );
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let own = own.lines().find(|l| l.starts_with("0::")).unwrap();
        assert_eq!(lines.next(), Some(own), "born in the group");
        assert_eq!(lines.next().map(str::trim), Some(pid.to_string().as_str()));
        assert_eq!(err, "oops\n");
        assert_eq!(
            exit_of(&b),
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid as i32), 3)
        );
    }

    #[test]
    fn a_place_that_is_no_group_makes_no_child() {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        let not_a_group = std::fs::File::open(dir.path()).unwrap();
        let cmd = std::process::Command::new("/bin/true");
        match spawn(&cmd, false, not_a_group.as_fd(), nix::unistd::getpid()) {
            Err(Error::Unsupported(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_script_without_an_interpreter_line_is_run_by_the_shell() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("no-shebang");
        std::fs::write(&script, "echo \"ran with $# args: $1 $2\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = std::process::Command::new(&script);
        cmd.args(["a b", "c"]);
        let b = run(&cmd, false).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            read_all(b.stdout.try_clone().unwrap()),
            "ran with 2 args: a b c\n"
        );
        assert_eq!(
            exit_of(&b),
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(b.pid as i32), 0)
        );
    }

    #[test]
    fn what_cannot_start_is_an_error_and_leaves_no_child() {
        let missing = std::process::Command::new("paddock-no-such-program");
        match run(&missing, false) {
            Err(Error::Failed(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        let mut nowhere = std::process::Command::new("/bin/true");
        nowhere.current_dir("/paddock/no/such/dir");
        match run(&nowhere, false) {
            Err(Error::Failed(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}"),
            other => panic!("{other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("not-executable");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        match run(&std::process::Command::new(&script), false) {
            Err(Error::Failed(e)) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied),
            other => panic!("{other:?}"),
        }
    }
}
