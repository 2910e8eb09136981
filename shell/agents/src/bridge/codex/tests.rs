//! The codex bridge's pure parts: command lines, permissions, settings, and the mapping of
//! real `codex exec --json` lines (captured from codex-cli 0.169.0 against a fake Responses
//! API) to what the daemon's reader sees.

use super::*;
use crate::bridge::wire::Buf;
use crate::claude_stream::{self, ClaudeStreamParser};
use paddock_core::{Activity, ActivityKind, ProviderEvent};

/// What the daemon's reader makes of the bridge's lines for `codex` lines in one turn.
#[derive(Debug, Default)]
struct Seen {
    acts: Vec<Activity>,
    session_refs: Vec<String>,
    unrecognized: Vec<String>,
    lines: Vec<serde_json::Value>,
}

fn map_turn(turn: u64, thread: Option<&str>, codex: &str) -> (Seen, bool, Option<String>) {
    map_turn_after(turn, thread, Totals::default(), codex)
}

fn map_turn_after(
    turn: u64,
    thread: Option<&str>,
    before: Totals,
    codex: &str,
) -> (Seen, bool, Option<String>) {
    let buf = Buf::default();
    let out = Out::to_writer("codex", Box::new(buf.clone()));
    let mut m = Mapper::new(&out, turn, thread.map(String::from), before);
    for l in codex.lines() {
        m.line(l);
    }
    let finished = m.finished();
    let thread = m.thread.clone();
    let text = buf.text();
    let mut p = ClaudeStreamParser::new();
    let mut seen = Seen::default();
    for l in text.lines() {
        if let Ok(v) = serde_json::from_str(l) {
            seen.lines.push(v);
        }
        for parsed in p.parse_line(l) {
            match parsed {
                claude_stream::Parsed::Event(ProviderEvent::Activity(a)) => seen.acts.push(a),
                claude_stream::Parsed::Event(ProviderEvent::SessionRef(s)) => {
                    seen.session_refs.push(s)
                }
                claude_stream::Parsed::Unrecognized(u) => seen.unrecognized.push(u),
                other => panic!("{other:?}"),
            }
        }
    }
    (seen, finished, thread)
}

fn kinds(acts: &[Activity]) -> Vec<ActivityKind> {
    acts.iter().map(|a| a.kind()).collect()
}

/// A turn with a shell command and a patch (`-s workspace-write`), as codex printed it.
const TOOL_TURN: &str = r#"{"type":"thread.started","thread_id":"01a20127-3c21-7563-b131-35ea6646ad1e"}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Planning** the work"}}
{"type":"item.started","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc 'echo made-by-shell > shell.txt && ls'","aggregated_output":"","exit_code":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc 'echo made-by-shell > shell.txt && ls'","aggregated_output":"shell.txt\n","exit_code":0,"status":"completed"}}
{"type":"item.started","item":{"id":"item_1","type":"file_change","changes":[{"path":"/tmp/cx/p2/hello.txt","kind":"add"}],"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_1","type":"file_change","changes":[{"path":"/tmp/cx/p2/hello.txt","kind":"add"}],"status":"completed"}}
{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Done."}}
{"type":"turn.completed","usage":{"input_tokens":900,"cached_input_tokens":400,"cache_write_input_tokens":0,"output_tokens":55,"reasoning_output_tokens":0}}"#;

#[test]
fn a_tool_turn_reads_back_as_activities() {
    let (seen, finished, thread) = map_turn(1, None, TOOL_TURN);
    assert!(finished);
    assert_eq!(
        thread.as_deref(),
        Some("01a20127-3c21-7563-b131-35ea6646ad1e")
    );
    assert_eq!(seen.session_refs, ["01a20127-3c21-7563-b131-35ea6646ad1e"]);
    use ActivityKind::*;
    assert_eq!(
        kinds(&seen.acts),
        [Thinking, ToolCall, ToolResult, ToolCall, ToolResult, Text, Completion]
    );
    let a = &seen.acts;
    assert_eq!(a[0].content, "**Planning** the work");
    assert_eq!(a[1].tool_name, "command_execution");
    assert_eq!(a[1].tool_call_id, "t1:item_0");
    assert!(
        a[1].content.contains("echo made-by-shell"),
        "{}",
        a[1].content
    );
    assert_eq!(a[2].tool_name, "command_execution");
    assert_eq!(a[2].tool_call_id, "t1:item_0");
    assert!(a[2].tool_success);
    assert_eq!(a[2].content, "shell.txt\n");
    assert_eq!(a[3].tool_name, "file_change");
    assert_eq!(a[4].content, "add /tmp/cx/p2/hello.txt");
    assert!(a[4].tool_success);
    assert_eq!(a[5].content, "Done.");
    assert_eq!(a[6].content, "Done.");
    // Input = input_tokens (cached ones included), counted once; output as reported.
    let total: (u64, u64) = a.iter().fold((0, 0), |(i, o), x| {
        (i + x.tokens_input, o + x.tokens_output)
    });
    assert_eq!(total, (900, 55));
    let result = seen.lines.last().unwrap();
    assert_eq!(result["usage"]["input_tokens"], 500);
    assert_eq!(result["usage"]["cache_read_input_tokens"], 400);
    assert_eq!(result["session_id"], "01a20127-3c21-7563-b131-35ea6646ad1e");
    assert!(seen.unrecognized.is_empty(), "{:?}", seen.unrecognized);
}

#[test]
fn a_failed_command_is_a_failed_tool_result() {
    let t = r#"{"type":"thread.started","thread_id":"th"}
{"type":"item.started","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc 'echo x > r.txt'","aggregated_output":"","exit_code":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc 'echo x > r.txt'","aggregated_output":"/bin/bash: line 1: r.txt: Read-only file system\n","exit_code":1,"status":"failed"}}
{"type":"item.completed","item":{"id":"item_9","type":"command_execution","command":"rm -rf /","aggregated_output":"","exit_code":null,"status":"declined"}}
{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Could not write."}}
{"type":"turn.completed","usage":{"input_tokens":300,"cached_input_tokens":0,"output_tokens":30}}"#;
    let (seen, finished, _) = map_turn(2, Some("th"), t);
    assert!(finished);
    use ActivityKind::*;
    assert_eq!(
        kinds(&seen.acts),
        [ToolCall, ToolResult, ToolCall, ToolResult, Text, Completion]
    );
    assert!(!seen.acts[1].tool_success);
    assert_eq!(
        seen.acts[1].content,
        "/bin/bash: line 1: r.txt: Read-only file system\n(exit code 1)"
    );
    assert_eq!(seen.acts[1].tool_call_id, "t2:item_0");
    // A completed item with no started one still gets its call first.
    assert_eq!(seen.acts[2].tool_call_id, "t2:item_9");
    assert!(!seen.acts[3].tool_success);
    assert_eq!(seen.acts[3].content, "(declined)");
}

#[test]
fn turn_failed_is_an_error_with_its_message() {
    let t = r#"{"type":"thread.started","thread_id":"01a20128-295b-72d2-8cc4-2afcbbd8851e"}
{"type":"turn.started"}
{"type":"error","message":"We’re currently experiencing high demand, which may cause temporary errors."}
{"type":"turn.failed","error":{"message":"We’re currently experiencing high demand, which may cause temporary errors."}}"#;
    let (seen, finished, _) = map_turn(1, None, t);
    assert!(finished);
    assert_eq!(kinds(&seen.acts), [ActivityKind::Error]);
    assert_eq!(
        seen.acts[0].content,
        "codex: error: We’re currently experiencing high demand, which may cause temporary errors."
    );
    // The top-level error line is kept raw (stored, counted), not shown twice.
    assert_eq!(seen.unrecognized.len(), 1);
    assert!(seen.unrecognized[0].contains(r#""type":"error""#));
    let result = seen.lines.last().unwrap();
    assert_eq!(result["is_error"], true);
    assert_eq!(result["session_id"], "01a20128-295b-72d2-8cc4-2afcbbd8851e");
}

#[test]
fn an_error_item_is_a_warning_and_the_turn_still_completes() {
    let t = r#"{"type":"thread.started","thread_id":"01a20128-786d-7be3-9411-ba237619f492"}
{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for `paddock-test-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues."}}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"hi"}}
{"type":"turn.completed","usage":{"input_tokens":500,"cached_input_tokens":100,"cache_write_input_tokens":50,"output_tokens":9,"reasoning_output_tokens":0}}"#;
    let (seen, _, _) = map_turn(1, None, t);
    use ActivityKind::*;
    assert_eq!(kinds(&seen.acts), [Status, Text, Completion]);
    assert!(seen.acts[0]
        .content
        .starts_with("codex: Model metadata for `paddock-test-model` not found"));
    assert_eq!(seen.acts[2].content, "hi");
    let result = seen.lines.last().unwrap();
    assert_eq!(result["usage"]["input_tokens"], 400);
    assert_eq!(result["usage"]["cache_read_input_tokens"], 100);
    assert_eq!(result["usage"]["output_tokens"], 9);
}

#[test]
fn web_search_mcp_and_todo_items() {
    // web_search as codex 0.169 prints it (with its `id` key twice: the last one counts).
    let t = r#"{"type":"item.started","item":{"id":"item_1","type":"web_search","id":"ws_1","query":"rust tokio","action":{"type":"search","query":"rust tokio"}}}
{"type":"item.completed","item":{"id":"item_1","type":"web_search","id":"ws_1","query":"rust tokio","action":{"type":"search","query":"rust tokio"}}}
{"type":"item.started","item":{"id":"item_2","type":"mcp_tool_call","server":"docs","tool":"lookup","arguments":{"q":"x"},"result":null,"error":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_2","type":"mcp_tool_call","server":"docs","tool":"lookup","arguments":{"q":"x"},"result":{"content":[{"type":"text","text":"found it"}],"structured_content":null},"error":null,"status":"completed"}}
{"type":"item.started","item":{"id":"item_3","type":"mcp_tool_call","server":"docs","tool":"boom","arguments":{},"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_3","type":"mcp_tool_call","server":"docs","tool":"boom","arguments":{},"result":null,"error":{"message":"tool crashed"},"status":"failed"}}
{"type":"item.started","item":{"id":"item_4","type":"todo_list","items":[{"text":"first","completed":false},{"text":"second","completed":false}]}}
{"type":"item.updated","item":{"id":"item_4","type":"todo_list","items":[{"text":"first","completed":true},{"text":"second","completed":false}]}}
{"type":"item.completed","item":{"id":"item_4","type":"todo_list","items":[{"text":"first","completed":true},{"text":"second","completed":false}]}}
{"type":"item.updated","item":{"id":"item_5","type":"command_execution","command":"ls","aggregated_output":"a","status":"in_progress"}}
{"type":"turn.completed","usage":{}}"#;
    let (seen, finished, thread) = map_turn(4, None, t);
    assert!(finished);
    assert_eq!(thread, None);
    use ActivityKind::*;
    assert_eq!(
        kinds(&seen.acts),
        [
            ToolCall, ToolResult, ToolCall, ToolResult, ToolCall, ToolResult, Text, Text,
            Completion
        ]
    );
    let a = &seen.acts;
    assert_eq!(a[0].tool_name, "web_search");
    assert_eq!(a[0].tool_call_id, "t4:ws_1");
    assert_eq!(a[1].content, "rust tokio");
    assert_eq!(a[2].tool_name, "mcp_tool_call");
    assert!(a[2].content.contains("lookup"), "{}", a[2].content);
    assert_eq!(a[3].content, "found it");
    assert!(a[3].tool_success);
    assert_eq!(a[5].content, "tool crashed");
    assert!(!a[5].tool_success);
    assert_eq!(a[6].content, "Plan:\n[ ] first\n[ ] second");
    // The completed list equals the updated one: printed once.
    assert_eq!(a[7].content, "Plan:\n[x] first\n[ ] second");
    // Updates of tool items carry nothing the call or its result will not.
    assert_eq!(a[8].content, "");
    assert_eq!((a[8].tokens_input, a[8].tokens_output), (0, 0));
}

#[test]
fn unknown_lines_are_passed_on_raw() {
    let t = r#"not json at all
{"type":"turn.rate_limited","retry_in":3}
{"type":"item.completed","item":{"id":"item_0","type":"image_view","path":"a.png"}}
{"type":"item.completed","item":"odd"}
{"type":"thread.started"}
[1,2]"#;
    let (seen, finished, _) = map_turn(1, None, t);
    assert!(!finished);
    assert!(seen.acts.is_empty(), "{:?}", seen.acts);
    assert_eq!(seen.unrecognized.len(), 6, "{:?}", seen.unrecognized);
    assert_eq!(seen.unrecognized[0], "not json at all");
}

#[test]
fn a_turn_ends_once() {
    let buf = Buf::default();
    let out = Out::to_writer("codex", Box::new(buf.clone()));
    let mut m = Mapper::new(&out, 1, Some("th".into()), Totals::default());
    m.line(r#"{"type":"turn.failed","error":{"message":"first"}}"#);
    m.fail("second".into());
    m.line(r#"{"type":"turn.completed","usage":{"input_tokens":1}}"#);
    let text = buf.text();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains(r#""result":"first""#));
    assert!(text.contains(r#""session_id":"th""#));
}

#[test]
fn usage_is_parsed_leniently() {
    let t = Totals::parse(&json!({"input_tokens": 1000, "cached_input_tokens": 250,
        "output_tokens": 40, "cache_write_input_tokens": 70, "reasoning_output_tokens": 12,
        "brand_new": {"x": 1}}));
    assert_eq!(
        t,
        Totals {
            input: 1000,
            cached: 250,
            output: 40
        }
    );
    let u = Totals::parse(&json!({"input_tokens": "12", "cached_input_tokens": null,
        "output_tokens": 3.0}))
    .since(Totals::default());
    assert_eq!(
        u,
        Usage {
            input_tokens: 12,
            cache_read_input_tokens: 0,
            output_tokens: 3,
            ..Usage::default()
        }
    );
    assert_eq!(Totals::parse(&json!("nonsense")), Totals::default());
    assert_eq!(
        Totals::parse(&json!({"input_tokens": -5, "output_tokens": true})),
        Totals::default()
    );
}

#[test]
fn a_turn_counts_what_the_thread_total_grew_by() {
    let before = Totals {
        input: 1000,
        cached: 600,
        output: 50,
    };
    let after = Totals {
        input: 1900,
        cached: 1000,
        output: 80,
    };
    assert_eq!(
        after.since(before),
        Usage {
            input_tokens: 500,
            cache_read_input_tokens: 400,
            output_tokens: 30,
            ..Usage::default()
        }
    );
    // A total that went down is a codex that reports per turn: taken as it is.
    let own = Totals {
        input: 300,
        cached: 100,
        output: 9,
    };
    assert_eq!(
        own.since(before),
        Usage {
            input_tokens: 200,
            cache_read_input_tokens: 100,
            output_tokens: 9,
            ..Usage::default()
        }
    );
    // Through the mapper: a resumed thread's second turn (codex 0.169 reports 300/30 for a
    // thread whose first turn took 100/10).
    let t = r#"{"type":"thread.started","thread_id":"th"}
{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"again"}}
{"type":"turn.completed","usage":{"input_tokens":300,"cached_input_tokens":0,"cache_write_input_tokens":0,"output_tokens":30,"reasoning_output_tokens":0}}"#;
    let first = Totals {
        input: 100,
        cached: 0,
        output: 10,
    };
    let (seen, _, _) = map_turn_after(2, Some("th"), first, t);
    let result = seen.lines.last().unwrap();
    assert_eq!(
        result["usage"],
        json!({"input_tokens": 200, "cache_read_input_tokens": 0, "output_tokens": 20})
    );
}

#[test]
fn a_threads_totals_are_read_from_codexs_rollout() {
    let home = tempfile::tempdir().unwrap();
    assert_eq!(recorded_totals(home.path(), "th-1"), None);
    let day = home.path().join("sessions/2026/11/22");
    std::fs::create_dir_all(&day).unwrap();
    // As codex 0.169 writes it (abridged): one token_count event per model call.
    let rollout = r#"{"timestamp":"2026-11-22T02:48:21.242Z","ordinal":0,"type":"session_meta","payload":{"id":"th-1","cwd":"/w"}}
{"timestamp":"2026-11-22T02:48:21.627Z","ordinal":12,"type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":{"input_tokens":100,"cached_input_tokens":0,"cache_write_input_tokens":0,"output_tokens":10,"reasoning_output_tokens":0,"total_tokens":110},"last_token_usage":{"input_tokens":100,"cached_input_tokens":0,"output_tokens":10}}}}
{"timestamp":"2026-11-22T02:48:23.277Z","ordinal":31,"type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":{"input_tokens":300,"cached_input_tokens":40,"cache_write_input_tokens":0,"output_tokens":30,"reasoning_output_tokens":0,"total_tokens":330},"last_token_usage":{"input_tokens":100,"cached_input_tokens":40,"output_tokens":10}}}}
{"timestamp":"2026-11-22T02:48:23.300Z","ordinal":32,"type":"event_msg","payload":{"type":"token_count","info":null,"rate_limits":null}}
{"timestamp":"2026-11-22T02:48:23.301Z","ordinal":33,"type":"event_msg","payload":{"type":"task_complete"}}
"#;
    std::fs::write(day.join("rollout-2026-11-22T02-48-20-th-1.jsonl"), rollout).unwrap();
    std::fs::write(day.join("rollout-2026-11-22T02-48-20-th-10.jsonl"), "").unwrap();
    assert_eq!(
        recorded_totals(home.path(), "th-1"),
        Some(Totals {
            input: 300,
            cached: 40,
            output: 30
        })
    );
    assert_eq!(recorded_totals(home.path(), "th-10"), None);
    assert_eq!(recorded_totals(home.path(), "th"), None);
}

fn settings(sandbox: &'static str) -> Settings {
    Settings {
        argv: vec!["/opt/codex".into(), "--profile-x".into()],
        model: "gpt-5.5".into(),
        sandbox,
        extra: vec!["model_provider=fake".into()],
        mcp: Vec::new(),
    }
}

#[test]
fn command_lines_for_new_and_resumed_threads() {
    let s = settings("danger-full-access");
    assert_eq!(
        s.args(None, "-x starts with a dash").join(" "),
        "--profile-x exec --json --skip-git-repo-check -m gpt-5.5 \
         -c approval_policy=\"never\" -c sandbox_mode=\"danger-full-access\" \
         -c check_for_update_on_startup=false -c analytics.enabled=false \
         -c model_provider=fake -- -x starts with a dash"
    );
    let mut s = settings("read-only");
    s.model.clear();
    s.extra.clear();
    let a = s.args(Some("01a2-thread"), "-");
    assert_eq!(
        a.join(" "),
        "--profile-x exec resume --json --skip-git-repo-check \
         -c approval_policy=\"never\" -c sandbox_mode=\"read-only\" \
         -c check_for_update_on_startup=false -c analytics.enabled=false \
         -- 01a2-thread -"
    );
    // With client tools: paddock's MCP server, before the session's own settings (which win).
    let mut s = settings("read-only");
    s.serve_mcp(
        std::path::Path::new("/opt/pad dock"),
        std::path::Path::new("/c/mcp.sock"),
    );
    assert_eq!(
        s.args(None, "hi").join(" "),
        "--profile-x exec --json --skip-git-repo-check -m gpt-5.5 \
         -c approval_policy=\"never\" -c sandbox_mode=\"read-only\" \
         -c check_for_update_on_startup=false -c analytics.enabled=false \
         -c mcp_servers.paddock.command=\"/opt/pad dock\" \
         -c mcp_servers.paddock.args=[\"__mcp-relay\", \"/c/mcp.sock\"] \
         -c mcp_servers.paddock.default_tools_approval_mode=\"approve\" \
         -c model_provider=fake -- hi"
    );
}

#[test]
fn permissions_map_onto_the_sandbox() {
    let p = |s: &str| sandbox_mode(&PermissionPolicy::parse(Some(s)).unwrap());
    assert_eq!(p(""), "danger-full-access");
    assert_eq!(p("allow-all"), "danger-full-access");
    assert_eq!(p("deny"), "read-only");
    assert_eq!(p("allow:web_search"), "read-only");
    assert_eq!(p("allow:Read,Grep"), "read-only");
    assert_eq!(p("allow:file_change"), "workspace-write");
    assert_eq!(p("allow:Read,Bash"), "workspace-write");
    assert_eq!(p("allow:command_execution"), "workspace-write");
}

#[test]
fn codex_config_lines() {
    assert_eq!(extra_config(None).unwrap(), Vec::<String>::new());
    let c = "model_provider=fake\n\n  # a comment\nmodel_providers.fake={name=\"fake\", base_url=\"http://x/v1\"}\r\nanalytics.enabled = true\n";
    assert_eq!(
        extra_config(Some(c)).unwrap(),
        [
            "model_provider=fake",
            "model_providers.fake={name=\"fake\", base_url=\"http://x/v1\"}",
            "analytics.enabled = true"
        ]
    );
    let e = extra_config(Some("ok=1\njust words"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2"), "{e}");
    assert!(extra_config(Some("=value")).is_err());
    // At CreateSession: OBEY-2004 (creation failed).
    let mut c = paddock_core::SessionConfig::new("c", Provider::Codex, "/tmp");
    c.provider_config
        .insert("command", "/bin/sh")
        .expect("a valid setting");
    c.environment
        .insert("OPENAI_API_KEY".into(), "sk-test".into());
    assert!(crate::validate(&c).is_ok());
    c.provider_config
        .insert("codex_config", "no equals sign")
        .expect("a valid setting");
    let e = crate::validate(&c).unwrap_err();
    assert_eq!(e.code, paddock_core::ErrorCode::CreationFailed);
    assert!(e.message.contains("codex_config"), "{e}");
}

#[test]
fn an_unfinished_turn_says_why() {
    let exit = TurnExit {
        code: Some(1),
        signal: None,
        stderr_tail: "WARNING: proceeding, even though we could not create PATH aliases\n\
                      Error: thread/resume: thread/resume failed: no rollout found for thread id 01a2 (code -32600)\n\
                      \n\
                      Stack backtrace:\n   0: <unknown>\n   1: <unknown>\n"
            .into(),
    };
    assert_eq!(
        unfinished_text(None, &exit),
        "codex ended before the turn did: exit code 1: WARNING: proceeding, even though we \
         could not create PATH aliases\nError: thread/resume: thread/resume failed: no rollout \
         found for thread id 01a2 (code -32600)"
    );
    let exit = TurnExit {
        code: Some(1),
        signal: None,
        stderr_tail: "Reading additional input from stdin...\n".into(),
    };
    assert_eq!(
        unfinished_text(Some("stream disconnected"), &exit),
        "stream disconnected (codex exit code 1)"
    );
}
