//! Provider adapters against the real agent CLIs, offline.
//!
//! The CLIs come from npm (versions pinned in `tests/npm/package.json`; `.ci/run` runs
//! `npm ci` there) and talk to a fake model server on 127.0.0.1 written here
//! (`fake_anthropic.rs`), which replays a per-test script of answers and records every request.
//! Each test starts the real `paddock daemon` and drives it over gRPC, as a client would.
//!
//! The tests that need a CLI are `#[ignore]`d in a plain `cargo test`; run them with
//! `cargo test -p paddock --test providers -- --include-ignored` after `cd tests/npm && npm ci`
//! (or with `PADDOCK_CLAUDE_BIN=/path/to/claude`).
//!
//! - `claude`: Claude Code (`claude -p --input-format stream-json --output-format stream-json`).
//! - `acp`: an Agent Client Protocol agent (Claude's ACP adapter) through paddock's ACP bridge.
//! - `openai`: paddock's own agent loop (`paddock __bridge openai`) against `fake_openai.rs`; no CLI, never ignored.
//! - `gemini`: Gemini CLI behind `paddock __bridge gemini` (one `gemini` run per turn; `PADDOCK_GEMINI_BIN`), against `fake_gemini.rs`.
//! - `codex`: codex through paddock's codex bridge (`codex exec --json` per turn), against a
//!   fake OpenAI Responses API (`fake_responses.rs`); its bridge tests with a fake `codex`
//!   script need no CLI.
//!
//! What every agent must do alike (a stop during a tool call, …) is written once in
//! `scenarios.rs` and run against each provider through its `Kit`.

mod acp;
mod claude;
mod codex;
mod fake_anthropic;
mod fake_gemini;
mod fake_http;
mod fake_openai;
mod fake_responses;
mod gemini;
mod harness;
mod openai;
mod scenarios;
