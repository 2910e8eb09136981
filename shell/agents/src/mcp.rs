//! Client-side tools for Claude Code: paddock serves an MCP server to the agent over the
//! stream-json control channel it already speaks, with no process or socket of its own.
//!
//! Claude Code runs "SDK" MCP servers — `--mcp-config '{"mcpServers":{"paddock":{"type":"sdk",
//! "name":"paddock"}}}'` — by sending each JSON-RPC message as a `control_request` of subtype
//! `mcp_message` (`{"server_name":"paddock","message":{…}}`) on its stdout, and reading the
//! answer as a `control_response` whose `response` is `{"mcp_response":{…}}` (checked against
//! Claude Code 2.1.330: it opens with `initialize` right after its start, before any turn).
//! paddock answers the protocol itself (`initialize`, notifications, `tools/list` from the
//! session's `client_tools`, `ping`); a `tools/call` becomes the core's client-tool request
//! ([`AskKind::ClientTool`]), answered by the session's client like the openai-api loop's,
//! and its result goes back as the call's `content`.
//!
//! [`AskKind::ClientTool`]: paddock_core::AskKind::ClientTool

use serde_json::{json, Value};

use super::stream_json::{self, ControlResponse};

pub use paddock_core::ClientTool;

/// The MCP server's name, as the agent sees it (its tools are `mcp__paddock__<name>`).
pub const SERVER: &str = "paddock";
/// The MCP revisions this server answers in, newest first (its tools need nothing newer).
const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// How the agent names the server's tools: `mcp__paddock__<name>`.
pub const TOOL_PREFIX: &str = "mcp__paddock__";

/// The prefix of a client-tool request's key that came through MCP: `mcp:<JSON-RPC id>:<the
/// control request's id>` (the answer needs both).
const KEY_PREFIX: &str = "mcp:";

/// `--mcp-config` and `--allowedTools` for an agent offered `tools`: the client's tools run
/// when the agent calls them (the client is the one who runs them: no permission prompt).
pub fn claude_args(tools: &[ClientTool]) -> Vec<String> {
    if tools.is_empty() {
        return Vec::new();
    }
    let config = json!({"mcpServers": {SERVER: {"type": "sdk", "name": SERVER}}});
    let mut args = vec!["--mcp-config".to_string(), config.to_string()];
    args.push("--allowedTools".into());
    args.push(
        tools
            .iter()
            .map(|t| format!("{TOOL_PREFIX}{}", t.name))
            .collect::<Vec<_>>()
            .join(","),
    );
    args
}

/// What a `mcp_message` control request comes to.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Answered at once (the protocol's own messages, refusals).
    Reply(String),
    /// A call of client tool `tool` with `arguments`: the core's to have answered; `key`
    /// names it in the answer ([`answer_line`]).
    Call {
        key: String,
        tool: String,
        arguments: Value,
    },
}

fn response(request_id: &str, mcp: Value) -> String {
    stream_json::encode(&ControlResponse::mcp(request_id, mcp))
}

fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// What paddock's MCP server does with one JSON-RPC message, whatever carries it (Claude
/// Code's control channel today; a socket for agents that start their MCP servers as
/// processes would carry the same messages).
#[derive(Debug, PartialEq)]
pub enum Rpc {
    /// A notification: nothing to answer.
    Notification,
    /// The JSON-RPC answer.
    Reply(Value),
    /// A call of client tool `tool`: the client's to answer ([`call_result`] makes the reply).
    Call {
        id: Value,
        tool: String,
        arguments: Value,
    },
}

/// The reply to call `id` with the client's result.
pub fn call_result(id: &Value, text: &str, is_error: bool) -> Value {
    result(
        id,
        json!({"content": [{"type": "text", "text": text}], "isError": is_error}),
    )
}

/// Handles one JSON-RPC message for a server offering `tools`.
pub fn rpc(message: &Value, tools: &[ClientTool]) -> Rpc {
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let Some(id) = message.get("id").cloned() else {
        return Rpc::Notification;
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    match method {
        "initialize" => {
            // The client's version if paddock speaks it, else the newest paddock does (the
            // client then decides whether it can go on).
            let asked = params.get("protocolVersion").and_then(Value::as_str);
            let version = asked
                .filter(|v| PROTOCOL_VERSIONS.contains(v))
                .unwrap_or(PROTOCOL_VERSIONS[0]);
            Rpc::Reply(result(
                &id,
                json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": SERVER, "version": env!("CARGO_PKG_VERSION")},
                }),
            ))
        }
        "ping" => Rpc::Reply(result(&id, json!({}))),
        "tools/list" => {
            let list: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "inputSchema": t.parameters,
                    })
                })
                .collect();
            Rpc::Reply(result(&id, json!({"tools": list})))
        }
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            if !tools.iter().any(|t| t.name == name) {
                return Rpc::Reply(call_result(&id, &format!("no client tool {name:?}"), true));
            }
            Rpc::Call {
                id,
                tool: name.to_string(),
                arguments: params.get("arguments").cloned().unwrap_or(json!({})),
            }
        }
        other => Rpc::Reply(error(&id, -32601, &format!("method {other:?} not found"))),
    }
}

/// Handles one `mcp_message` for server `server` offering `tools`.
pub fn handle(request_id: &str, server: &str, message: &Value, tools: &[ClientTool]) -> Step {
    if server != SERVER {
        let why = format!("paddock serves no MCP server {server:?}");
        return Step::Reply(stream_json::encode(&ControlResponse::error(
            request_id, &why,
        )));
    }
    match rpc(message, tools) {
        // Nothing to answer but the control request itself.
        Rpc::Notification => Step::Reply(response(
            request_id,
            json!({"jsonrpc": "2.0", "result": {}, "id": 0}),
        )),
        Rpc::Reply(v) => Step::Reply(response(request_id, v)),
        Rpc::Call {
            id,
            tool,
            arguments,
        } => Step::Call {
            key: format!("{KEY_PREFIX}{id}:{request_id}"),
            tool,
            arguments,
        },
    }
}

/// The answer to a client-tool call that came through MCP (`key` made by [`handle`]), `None`
/// for any other key.
pub fn answer_line(key: &str, text: &str, is_error: bool) -> Option<String> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    // The JSON-RPC id is JSON (a number or a string) and never holds the request id's form;
    // the control request's id is the last field.
    let (id, request_id) = rest.rsplit_once(':')?;
    let id: Value = serde_json::from_str(id).ok()?;
    Some(response(request_id, call_result(&id, text, is_error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ClientTool> {
        vec![ClientTool {
            name: "lookup".into(),
            description: "looks a word up".into(),
            parameters: json!({"type": "object", "properties": {"word": {"type": "string"}}}),
        }]
    }

    fn mcp_response(line: &str) -> Value {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["type"], "control_response");
        assert_eq!(v["response"]["subtype"], "success");
        v["response"]["response"]["mcp_response"].clone()
    }

    #[test]
    fn the_protocol_is_answered_and_calls_go_to_the_client() {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
        let Step::Reply(line) = handle("r1", SERVER, &init, &tools()) else {
            panic!("answered at once")
        };
        let r = mcp_response(&line);
        assert_eq!(r["id"], 0);
        assert_eq!(r["result"]["protocolVersion"], "2025-11-25");
        let future = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2099-01-01"}});
        let Step::Reply(line) = handle("r0", SERVER, &future, &tools()) else {
            panic!()
        };
        assert_eq!(
            mcp_response(&line)["result"]["protocolVersion"],
            PROTOCOL_VERSIONS[0]
        );
        assert!(r["result"]["capabilities"]["tools"].is_object());
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        let Step::Reply(line) = handle("r2", SERVER, &list, &tools()) else {
            panic!()
        };
        let r = mcp_response(&line);
        assert_eq!(r["result"]["tools"][0]["name"], "lookup");
        assert_eq!(r["result"]["tools"][0]["inputSchema"]["type"], "object");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert!(matches!(
            handle("r3", SERVER, &note, &tools()),
            Step::Reply(_)
        ));

        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "lookup", "arguments": {"word": "paddock"}}});
        let Step::Call {
            key,
            tool,
            arguments,
        } = handle("r4", SERVER, &call, &tools())
        else {
            panic!("a call is the client's")
        };
        assert_eq!(
            (tool.as_str(), arguments),
            ("lookup", json!({"word": "paddock"}))
        );
        let line = answer_line(&key, "an enclosure", false).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["response"]["request_id"], "r4");
        let r = &v["response"]["response"]["mcp_response"];
        assert_eq!(r["id"], 7);
        assert_eq!(r["result"]["content"][0]["text"], "an enclosure");
        assert_eq!(r["result"]["isError"], false);
        assert_eq!(answer_line("req_1", "x", false), None, "not an MCP call");

        let unknown = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "rm"}});
        let Step::Reply(line) = handle("r5", SERVER, &unknown, &tools()) else {
            panic!()
        };
        assert_eq!(mcp_response(&line)["result"]["isError"], true);
        let other = json!({"jsonrpc": "2.0", "id": 9, "method": "resources/list"});
        let Step::Reply(line) = handle("r6", SERVER, &other, &tools()) else {
            panic!()
        };
        assert_eq!(mcp_response(&line)["error"]["code"], -32601);
        let Step::Reply(line) = handle("r7", "elsewhere", &list, &tools()) else {
            panic!()
        };
        assert!(line.contains("\"error\""), "{line}");
    }

    #[test]
    fn claude_is_told_of_the_server_only_when_there_are_tools() {
        assert!(claude_args(&[]).is_empty());
        let args = claude_args(&tools());
        assert_eq!(args[0], "--mcp-config");
        assert!(args[1].contains("\"type\":\"sdk\""));
        assert_eq!(args[3], "mcp__paddock__lookup");
    }
}
