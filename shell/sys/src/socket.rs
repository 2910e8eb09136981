//! Claiming a Unix socket and deciding who may talk on it, the same way for every paddock server
//! (the daemon, the Aria socket, the runner).
//!
//! Two locks, each enough on its own:
//! - **the file system**: the socket's directory is ours and no one else can write to it (a
//!   directory that already exists is checked, not trusted: another user who pre-created it could
//!   rename our socket away and listen in its place), and the socket is 0600;
//! - **the peer's credentials**: every accepted connection's `SO_PEERCRED` uid must be ours or on
//!   the allow-list ([`Peers`]); anyone else is dropped before a byte of gRPC is read, so a socket
//!   someone made world-writable still serves only its owner.

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt};

/// Why a socket could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("cannot create the socket directory {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the socket directory {}: {source}", dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory exists but another user owns it, or others may write to it: whoever can
    /// could replace our socket with theirs.
    #[error(
        "refusing the socket directory {}: {why}; another user could replace the socket \
         (remove the directory, or choose another place with --socket)",
        dir.display()
    )]
    UnsafeDir { dir: PathBuf, why: String },
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("another {who} is already listening on {}", path.display())]
    InUse { who: String, path: PathBuf },
    #[error("cannot use {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Creates the socket's directory (0700, when it does not exist; checked when it does) and binds
/// the socket (0600). A socket something still answers on is refused ("another `who` is already
/// listening"); a stale one (nothing answers) is replaced.
/// The listening socket a service manager passed this process (systemd socket activation:
/// `LISTEN_PID` names us, `LISTEN_FDS` ≥ 1, the first one taken), if any; the variables are
/// removed so that nothing this process starts takes it for its own. An fd that is not a Unix
/// stream socket is an error.
pub fn activated() -> Result<Option<UnixListener>, BindError> {
    let io = |source| BindError::Io {
        path: PathBuf::from("LISTEN_FDS"),
        source,
    };
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Ok(None);
    }
    let Some(std_listener) = fds.take_unix_listener(0).map_err(io)? else {
        return Ok(None);
    };
    std_listener.set_nonblocking(true).map_err(io)?;
    UnixListener::from_std(std_listener).map(Some).map_err(io)
}

pub fn bind(path: &Path, who: &str) -> Result<UnixListener, BindError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|source| BindError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| BindError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            },
        )?;
    }
    check_dir(dir)?;
    let io = |source| BindError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
        Ok(m) if !m.file_type().is_socket() => {
            return Err(BindError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(BindError::InUse {
                    who: who.to_string(),
                    path: path.to_path_buf(),
                })
            }
            Err(_) => {
                tracing::info!("replacing stale socket {}", path.display());
                std::fs::remove_file(path).map_err(io)?;
            }
        },
    }
    // Bind with a restrictive umask so the socket is never reachable by others, not even for a
    // moment, then make the mode explicit.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}

/// A socket's directory is safe when we (or root) own it and no one else may write to it, or
/// when it is a sticky shared directory (`/tmp`): there no one can rename or remove our socket,
/// and a path someone else created first is refused by [`bind`] as in use or not a socket.
fn check_dir(dir: &Path) -> Result<(), BindError> {
    let meta = std::fs::metadata(dir).map_err(|source| BindError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode() & 0o7777;
    let why = if meta.uid() != me && meta.uid() != 0 {
        Some(format!("it is owned by uid {}, not {me}", meta.uid()))
    } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        Some(format!("others may write to it (mode {mode:04o})"))
    } else {
        None
    };
    match why {
        Some(why) => Err(BindError::UnsafeDir {
            dir: dir.to_path_buf(),
            why,
        }),
        None => Ok(()),
    }
}

/// Who may connect: the server's own uid always, plus the allowed uids and the members of the
/// allowed groups (the peer's primary group or any supplementary group of the connecting
/// process). Checked on every accepted connection with `SO_PEERCRED`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peers {
    pub uids: BTreeSet<u32>,
    pub gids: BTreeSet<u32>,
}

impl Peers {
    /// Only the server's own uid.
    pub fn owner_only() -> Peers {
        Peers::default()
    }

    /// The allow-list from its text form: uids as numbers or user names, groups as gids or
    /// group names. An unknown name is an error, not a silent no-op.
    pub fn parse(users: &[String], groups: &[String]) -> Result<Peers, UnknownPeer> {
        let mut peers = Peers::default();
        for u in users {
            let uid = match u.parse::<u32>() {
                Ok(n) => n,
                Err(_) => match nix::unistd::User::from_name(u) {
                    Ok(Some(user)) => user.uid.as_raw(),
                    _ => return Err(UnknownPeer::User(u.clone())),
                },
            };
            peers.uids.insert(uid);
        }
        for g in groups {
            let gid = match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => match nix::unistd::Group::from_name(g) {
                    Ok(Some(group)) => group.gid.as_raw(),
                    _ => return Err(UnknownPeer::Group(g.clone())),
                },
            };
            peers.gids.insert(gid);
        }
        Ok(peers)
    }

    /// Whether a peer with these credentials may talk to us.
    pub fn allows(&self, uid: u32, gid: u32, pid: Option<i32>) -> bool {
        if uid == nix::unistd::geteuid().as_raw() || self.uids.contains(&uid) {
            return true;
        }
        if self.gids.is_empty() {
            return false;
        }
        self.gids.contains(&gid) || pid.is_some_and(|p| self.has_group(p))
    }

    /// The connecting process's supplementary groups, from `/proc/<pid>/status`.
    fn has_group(&self, pid: i32) -> bool {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return false;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse::<u32>().ok())
                    .any(|n| self.gids.contains(&n))
            })
    }
}

/// The listener's connections from allowed peers only; anyone else is dropped at once (logged
/// with their uid). Hand it to tonic's `serve_with_incoming*`.
pub fn incoming(
    listener: UnixListener,
    peers: Peers,
    who: &'static str,
) -> impl Stream<Item = std::io::Result<UnixStream>> {
    tokio_stream::wrappers::UnixListenerStream::new(listener).filter(move |conn| {
        let Ok(stream) = conn else { return true };
        match stream.peer_cred() {
            Ok(c) if peers.allows(c.uid(), c.gid(), c.pid()) => true,
            Ok(c) => {
                tracing::warn!(uid = c.uid(), pid = ?c.pid(), "{who}: refused a connection from a user not allowed");
                false
            }
            Err(e) => {
                tracing::warn!("{who}: refused a connection whose credentials cannot be read: {e}");
                false
            }
        }
    })
}

/// The user a request came from, by its connection's credentials (the name, else the uid); ""
/// when the transport has none (not a Unix socket).
pub fn peer_user<T>(request: &tonic::Request<T>) -> String {
    let uid = request
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|info| info.peer_cred)
        .map(|cred| cred.uid());
    match uid {
        Some(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name),
        None => String::new(),
    }
}

/// A name in the allow-list ([`Peers::parse`]) that is no user or group here.
#[derive(Debug, thiserror::Error)]
pub enum UnknownPeer {
    #[error("unknown user {0:?} in the socket allow-list")]
    User(String),
    #[error("unknown group {0:?} in the socket allow-list")]
    Group(String),
}

/// A socket that belongs to another user ([`check_owner`]): nothing is sent to it.
#[derive(Debug, thiserror::Error)]
#[error("refusing to talk to {}: it belongs to uid {owner}, not to you (uid {me})", .path.display())]
pub struct Untrusted {
    pub path: std::path::PathBuf,
    pub owner: u32,
    pub me: u32,
}

/// A client's check before it sends anything: the socket must belong to us or to root, so a
/// socket another user put in our place never receives a request (and the secrets in it).
pub fn check_owner(path: &Path) -> Result<(), Untrusted> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // nothing there: connecting will say so
    };
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() == me || meta.uid() == 0 {
        Ok(())
    } else {
        Err(Untrusted {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn modes_stale_sockets_and_live_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub").join("x.sock");
        let l = bind(&path, "test server").unwrap();
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o600);
        let err = bind(&path, "test server").unwrap_err();
        assert!(matches!(err, BindError::InUse { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("another test server is already listening"),
            "{err}"
        );
        drop(l); // the file stays, nobody answers: stale
        assert!(path.exists());
        let _l = bind(&path, "test server").unwrap();
    }

    #[test]
    fn a_writable_existing_directory_is_refused_and_a_sticky_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = bind(&dir.join("x.sock"), "test server").unwrap_err();
        assert!(matches!(err, BindError::UnsafeDir { .. }), "{err}");
        assert!(err.to_string().contains("mode 0777"), "{err}");
        assert!(!dir.join("x.sock").exists(), "nothing bound");

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { bind(&dir.join("x.sock"), "test server").unwrap() });
    }

    #[test]
    fn a_file_in_the_sockets_place_is_not_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.sock");
        std::fs::write(&path, "precious").unwrap();
        let err = bind(&path, "test server").unwrap_err();
        assert!(matches!(err, BindError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
    }

    #[test]
    fn the_allow_list() {
        let me = nix::unistd::geteuid().as_raw();
        let other = me + 4242;
        let owner = Peers::owner_only();
        assert!(owner.allows(me, 0, None));
        assert!(!owner.allows(other, other, None));
        let by_uid = Peers::parse(&[other.to_string()], &[]).unwrap();
        assert!(by_uid.allows(other, other, None));
        let by_gid = Peers::parse(&[], &["4243".to_string()]).unwrap();
        assert!(by_gid.allows(other, 4243, None));
        assert!(!by_gid.allows(other, 4244, None));
        // Supplementary groups are read from the connecting process: our own groups here.
        let mine = nix::unistd::getgroups().unwrap();
        if let Some(g) = mine.first() {
            let sup = Peers::parse(&[], &[g.as_raw().to_string()]).unwrap();
            assert!(sup.allows(other, 999_999, Some(std::process::id() as i32)));
        }
        assert!(matches!(
            Peers::parse(&["no-such-user-paddock".to_string()], &[]),
            Err(UnknownPeer::User(u)) if u == "no-such-user-paddock"
        ));
        assert!(matches!(
            Peers::parse(&[], &["no-such-group-paddock".to_string()]),
            Err(UnknownPeer::Group(_))
        ));
    }
}
