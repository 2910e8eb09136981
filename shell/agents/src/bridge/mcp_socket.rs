//! paddock's MCP server for agents that start their MCP servers as processes (gemini, codex,
//! ACP agents): the bridge serves it on a Unix socket in a private directory of its own, and
//! the agent starts `paddock __mcp-relay <socket>`, which only copies its stdin and stdout to
//! and from that socket. The server is [`crate::mcp::rpc`], the same as Claude
//! Code's; a `tools/call` becomes the bridge's `client_tool` request to the daemon
//! ([`super::wire::In::run_on_client`]), answered by the session's client.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use super::openai::ClientTool;
use super::wire::In;
use super::Error;
use crate::mcp::{self, Rpc};

/// The longest JSON-RPC line taken from the agent (a tool call's arguments).
const LINE_MAX: u64 = 1024 * 1024;
/// Connections served at once (an agent opens one per server, one agent process per turn).
const CONNECTIONS_MAX: usize = 8;

/// A served MCP socket; the directory (the socket, an agent settings file) goes when it is
/// dropped.
pub struct Served {
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
    /// paddock's own binary: the agent starts it as `exe __mcp-relay socket`.
    pub exe: PathBuf,
}

impl Served {
    /// The relay's arguments after `exe`.
    pub fn relay_args(&self) -> [String; 2] {
        ["__mcp-relay".into(), self.socket.display().to_string()]
    }
}

/// Serves the session's client tools for `bridge`; `None` when it has none.
pub fn serve_client_tools(bridge: &super::Bridge) -> Result<Option<Served>, Error> {
    let tools = bridge.config.agent().client_tools.clone();
    serve(tools, bridge.input.clone())
}

/// Serves `tools` on a new socket, on threads of its own; `None` when there are none.
pub fn serve(tools: Vec<ClientTool>, input: Arc<In>) -> Result<Option<Served>, Error> {
    if tools.is_empty() {
        return Ok(None);
    }
    // Private (0700): only this user's processes reach it. Under the user's cache directory,
    // not /tmp: gemini reads a settings file only where no other user can write any directory
    // above it.
    let base = dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("paddock");
    std::fs::create_dir_all(&base).map_err(|source| Error::MakeDir {
        path: base.clone(),
        source,
    })?;
    let dir = tempfile::Builder::new()
        .prefix("mcp-")
        .tempdir_in(&base)
        .map_err(Error::McpDir)?;
    let exe = std::env::current_exe().map_err(Error::OwnExe)?;
    let socket = dir.path().join("mcp.sock");
    let listener = UnixListener::bind(&socket).map_err(|source| Error::McpServe {
        socket: socket.clone(),
        source,
    })?;
    let tools = Arc::new(tools);
    let live = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if live.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
                live.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let (tools, input, live) = (tools.clone(), input.clone(), live.clone());
            std::thread::spawn(move || {
                answer(conn, &tools, &input);
                live.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Ok(Some(Served { socket, dir, exe }))
}

/// Answers one agent's JSON-RPC lines until it hangs up.
fn answer(conn: UnixStream, tools: &[ClientTool], input: &In) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match (&mut lines).take(LINE_MAX).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(message) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        let reply = match mcp::rpc(&message, tools) {
            Rpc::Notification => continue,
            Rpc::Reply(v) => v,
            Rpc::Call {
                id,
                tool,
                arguments,
            } => {
                let (text, is_error) = input.run_on_client(&tool, &arguments);
                mcp::call_result(&id, &text, is_error)
            }
        };
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

/// `paddock __mcp-relay SOCKET`: the agent's MCP server process, a pipe to the bridge's socket.
pub fn relay(socket: &Path) -> i32 {
    let conn = match UnixStream::connect(socket) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "paddock: cannot reach the MCP socket {}: {e}",
                socket.display()
            );
            return 1;
        }
    };
    let Ok(from_socket) = conn.try_clone() else {
        return 1;
    };
    std::thread::spawn(move || {
        pump(from_socket, std::io::stdout());
        // The bridge hung up: nothing more will be answered.
        std::process::exit(0);
    });
    let to_socket = conn;
    pump(std::io::stdin(), &to_socket);
    let _ = to_socket.shutdown(std::net::Shutdown::Write);
    0
}

/// Copies `from` to `to` until either ends, each read written and flushed at once. Not
/// `std::io::copy`: between a socket and a pipe it moves the bytes with `splice(2)`, and
/// readers of the pipe that wait with poll (codex's MCP client, Python's) were then seen to
/// never get them (Linux 6.x, measured: the relay's splice returned, the reader's read blocked).
fn pump(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}

/// The `mcpServers` entry that starts the relay to `served` (gemini's settings shape):
/// trusted, since the client who runs the tools is the one who decides.
pub fn server_entry(served: &Served) -> Value {
    json!({
        mcp::SERVER: {
            "command": served.exe.display().to_string(),
            "args": served.relay_args(),
            "trust": true,
        }
    })
}
