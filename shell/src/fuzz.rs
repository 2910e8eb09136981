//! Fuzz targets (issue 15 point 9): every decoder of agent output and every parser of what a
//! user or a client hands the daemon, fed inputs that are mutations of a committed corpus of
//! real inputs (`shell/fuzz/corpus/<target>/`) or arbitrary text. Each must return (an error is
//! fine) without panicking, and keep the bounds it promises.
//!
//! Proptest drives them (stable Rust; cargo-fuzz needs nightly). `cargo test -p paddock --lib
//! fuzz` runs 256 inputs per target; a long run sets the count:
//! `PADDOCK_FUZZ_CASES=100000 cargo test -p paddock --lib --release fuzz`. Failures proptest
//! finds are kept in `shell/proptest-regressions/fuzz.txt` and replayed first.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;

/// Inputs per target: `PADDOCK_FUZZ_CASES`, 256 by default.
fn cases() -> u32 {
    std::env::var("PADDOCK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Every target is cheap; shrinking finds the smallest failing input.
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    }
}

/// The committed seed inputs of `target` (one file per input).
fn corpus(target: &str) -> &'static [Vec<u8>] {
    static ALL: OnceLock<std::collections::BTreeMap<String, Vec<Vec<u8>>>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        let mut all = std::collections::BTreeMap::new();
        for dir in std::fs::read_dir(&root)
            .expect("shell/fuzz/corpus")
            .flatten()
        {
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|f| f.path())
                .collect();
            files.sort();
            let inputs = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
            all.insert(dir.file_name().to_string_lossy().into_owned(), inputs);
        }
        all
    });
    let inputs = all
        .get(target)
        .unwrap_or_else(|| panic!("no corpus for {target}"));
    assert!(!inputs.is_empty(), "the corpus of {target} is empty");
    inputs
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    Duplicate(usize, usize),
    /// Splice in part of another corpus input.
    Splice(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bytes that matter to the formats: JSON, YAML, TOML and SSE punctuation, quotes, escapes,
    // digits, NUL, newline, high bytes (invalid UTF-8).
    let token = prop_oneof![
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"[".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"\\u0000".to_vec()),
        Just(b"\n".to_vec()),
        Just(b":".to_vec()),
        Just(b"null".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"18446744073709551616".to_vec()),
        Just(b"1e308".to_vec()),
        Just(b"data: ".to_vec()),
        Just(vec![0xff, 0xfe]),
        Just(vec![0]),
        proptest::collection::vec(any::<u8>(), 1..8),
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), token).prop_map(|(i, t)| Edit::Insert(i, t)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 1usize..256).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        (any::<usize>(), any::<usize>(), 1usize..256).prop_map(|(w, i, n)| Edit::Splice(w, i, n)),
    ]
}

fn apply(mut input: Vec<u8>, edits: &[Edit], others: &[Vec<u8>]) -> Vec<u8> {
    for e in edits {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match e {
            Edit::Flip(i, b) if !input.is_empty() => {
                let i = i % input.len();
                input[i] ^= b | 1;
            }
            Edit::Flip(..) => {}
            Edit::Insert(i, t) => {
                let i = at(*i, input.len());
                input.splice(i..i, t.iter().copied());
            }
            Edit::Delete(i, n) => {
                let i = at(*i, input.len());
                let end = (i + n).min(input.len());
                input.drain(i..end);
            }
            Edit::Truncate(i) => input.truncate(at(*i, input.len())),
            Edit::Duplicate(i, n) => {
                let i = at(*i, input.len());
                let end = (i + n).min(input.len());
                let part = input[i..end].to_vec();
                input.splice(end..end, part);
            }
            Edit::Splice(w, i, n) => {
                let other = &others[w % others.len()];
                let from = at(*i, other.len());
                let end = (from + n).min(other.len());
                let at_here = at(*i, input.len());
                input.splice(at_here..at_here, other[from..end].iter().copied());
            }
        }
    }
    input
}

/// Inputs for `target`: a corpus input with up to 8 edits, or arbitrary bytes.
fn inputs(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = corpus(target);
    prop_oneof![
        4 => (0..seeds.len(), proptest::collection::vec(edit(), 0..8))
            .prop_map(move |(i, edits)| apply(seeds[i].clone(), &edits, seeds)),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
    ]
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The lines of an input, as an agent's stdout would give them.
fn lines(bytes: &[u8]) -> Vec<String> {
    text(bytes).lines().map(str::to_string).collect()
}

/// `text` fed in chunks of about `cut` bytes (cut at characters, as the runner sends them)
/// to [`crate::proc::LineSplitter::feed_text`] and its bytes to `feed`: the same lines, at
/// the same ends, wherever the chunks end; a line cut keeps at most `max` bytes, the byte
/// splitter's line up to the character it split.
fn text_lines_match(text: &str, cut: usize, max: usize) -> Result<(), TestCaseError> {
    let mut chunks = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let at = rest.ceil_char_boundary(cut.min(rest.len()));
        let (chunk, after) = rest.split_at(at);
        chunks.push(chunk);
        rest = after;
    }
    let (mut bytes, mut texts) = (
        crate::proc::LineSplitter::new(max),
        crate::proc::LineSplitter::new(max),
    );
    let (mut by_bytes, mut by_text) = (Vec::new(), Vec::new());
    for chunk in chunks {
        bytes.feed(chunk.as_bytes(), &mut by_bytes);
        let mut lines = Vec::new();
        texts.feed_text(chunk, &mut lines);
        by_text.extend(lines.into_iter().map(|l| (l.text.into_owned(), l.end)));
    }
    prop_assert_eq!(by_bytes.len(), by_text.len());
    for (b, (t, end)) in by_bytes.iter().zip(&by_text) {
        prop_assert_eq!(b.end, *end);
        if b.cut_bytes == 0 {
            prop_assert_eq!(&b.text(), t);
        } else {
            let (kept, _) = t.split_once("… [").unwrap();
            prop_assert!(kept.len() <= max, "{} > {}", kept.len(), max);
            prop_assert!(b.text().starts_with(kept), "{:?} / {:?}", b.text(), t);
            prop_assert!(b.bytes.len() - kept.len() < 4, "{:?} / {:?}", b.text(), t);
        }
    }
    Ok(())
}

/// A writer that keeps what a bridge prints, to check that it is stream-json.
#[derive(Clone, Default)]
struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    /// What was printed, each line read back by the daemon's own stream-json reader (a bridge
    /// must only ever print what that reader takes).
    fn read_back(&self) {
        let printed = self.0.lock().unwrap().clone();
        let mut parser = crate::providers::stream_json();
        for line in text(&printed).lines() {
            let v: Value = serde_json::from_str(line).expect("a bridge prints JSON lines");
            assert!(v.is_object(), "a bridge prints JSON objects: {line}");
            parser.parse_line(line);
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Claude Code's stream-json (and the scripted agent's, and every bridge's output), through
    /// the reader the daemon runs, control requests included.
    #[test]
    fn stream_json_lines(input in inputs("stream_json")) {
        let mut parser = crate::providers::stream_json();
        for line in lines(&input) {
            parser.parse_line(&line);
        }
    }

    /// `codex exec --json` lines as the runner maps them (centaurx `Exec`).
    #[test]
    fn codex_exec_lines(input in inputs("codex_exec")) {
        for line in input.split(|b| *b == b'\n') {
            crate::runner::codex::map_line(line);
        }
    }

    /// The codex bridge's translation of `codex exec --json` into stream-json.
    #[test]
    fn codex_bridge_lines(input in inputs("codex_exec")) {
        let sink = Sink::default();
        let out = crate::providers::bridge::Out::to_writer("codex", Box::new(sink.clone()));
        let mut m = crate::providers::bridge::codex::Mapper::new(
            &out, 1, None, Default::default());
        for line in lines(&input) {
            m.line(&line);
        }
        sink.read_back();
    }

    /// The gemini bridge's translation of `gemini --output-format stream-json`.
    #[test]
    fn gemini_bridge_lines(input in inputs("gemini")) {
        let sink = Sink::default();
        let out = crate::providers::bridge::Out::to_writer("gemini", Box::new(sink.clone()));
        let mut t = crate::providers::bridge::gemini::Turn::new(None);
        for line in lines(&input) {
            t.line(&line, &out);
        }
        sink.read_back();
    }

    /// ACP `session/update` notifications through the ACP bridge's translator.
    #[test]
    fn acp_updates(input in inputs("acp")) {
        let updates: Vec<Value> = lines(&input)
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        crate::providers::bridge::acp::translate_for_test(&updates);
    }

    /// An OpenAI-compatible server's SSE stream, read with the bridge's bounds and
    /// accumulated into a completion.
    #[test]
    fn openai_sse(input in inputs("openai_sse")) {
        use crate::providers::bridge::openai::sse::{Accumulator, Event, SseReader};
        let mut r = SseReader::new(input.as_slice(), 1 << 20, 64 * 1024);
        let mut acc = Accumulator::default();
        let mut events = 0;
        while let Ok(Some(ev)) = r.next_event() {
            events += 1;
            prop_assert!(events <= input.len() + 1, "more events than bytes");
            if let Event::Chunk(v) = ev {
                if acc.chunk(&v).is_err() {
                    break;
                }
            }
        }
        acc.finish();
    }

    /// The scripted agent's script format.
    #[test]
    fn scripts(input in inputs("script")) {
        let _ = crate::providers::scripted::parse_script(&text(&input));
    }

    /// latis' `session.yaml`, flat and per-driver.
    #[test]
    fn session_yaml(input in inputs("session_yaml")) {
        let _ = crate::cli::latis::SessionFile::parse(&text(&input), "fuzz.yaml");
    }

    /// sunbeam's `StartSession.config_toml`.
    #[test]
    fn sunbeam_config(input in inputs("sunbeam_toml")) {
        let _ = crate::api::sunbeam::parse_config(&text(&input));
    }

    /// Request values every RPC validates: durations and timestamps, environments, campaign
    /// names and roots, mounts, drivers, client tool and codex config lists.
    #[test]
    fn request_values(
        seconds in any::<i64>(),
        nanos in any::<i32>(),
        input in inputs("values"),
    ) {
        use crate::api::convert;
        let d = prost_types::Duration { seconds, nanos };
        if let Ok(ms) = convert::duration_ms(&d) {
            prop_assert!(seconds >= 0 && (0..1_000_000_000).contains(&nanos));
            prop_assert_eq!(ms, seconds as u64 * 1000 + nanos as u64 / 1_000_000);
        }
        let t = prost_types::Timestamp { seconds, nanos };
        if convert::timestamp_ms(&t).is_ok() {
            prop_assert!(seconds >= 0 && (0..1_000_000_000).contains(&nanos));
        }
        let s = text(&input);
        let (k, v) = s.split_once('=').unwrap_or((&s, ""));
        let env = std::collections::BTreeMap::from([(k.to_string(), v.to_string())]);
        if paddock_core::check_environment(&env).is_ok() {
            prop_assert!(!k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'));
        }
        if paddock_core::campaign::check_name(&s).is_ok() {
            prop_assert!(!s.contains('/') && !s.trim().is_empty());
        }
        let _ = paddock_core::campaign::check_root(&s);
        let _ = crate::cli::latis::parse_mount(&s, Path::new("/tmp/fuzz-base"));
        let _ = crate::cli::latis::check_driver(&s);
        let _ = paddock_core::ProviderConfig::parse(std::collections::BTreeMap::from([(
            paddock_core::CLIENT_TOOLS_KEY.to_string(),
            s.clone(),
        )]));
        let _ = crate::providers::bridge::codex::extra_config(Some(&s));
        let _ = crate::secret::is_secret(&s);
    }

    /// Text split as the daemon splits the runner's output is what the byte splitter makes of
    /// the same bytes (see [`text_lines_match`]): agents' lines, and text of characters of
    /// every width.
    #[test]
    fn text_lines_are_the_byte_lines(
        input in inputs("stream_json"),
        cut in 1usize..256,
        max in 1usize..4096,
    ) {
        text_lines_match(&text(&input), cut, max)?;
    }

    #[test]
    fn text_lines_of_wide_characters_are_the_byte_lines(
        input in "[a-zé€😀\r\n]{0,400}",
        cut in 1usize..24,
        max in 1usize..64,
    ) {
        text_lines_match(&input, cut, max)?;
    }

    /// The line splitter every agent's and task's output goes through: lines never exceed
    /// the bound, and every byte is in a line or counted as cut.
    #[test]
    fn line_splitter(input in inputs("stream_json"), cut in 1usize..256, max in 1usize..4096) {
        let mut s = crate::proc::LineSplitter::new(max);
        let mut out = Vec::new();
        let mut fed = 0;
        for chunk in input.chunks(cut) {
            s.feed(chunk, &mut out);
            fed += chunk.len();
        }
        s.finish(&mut out);
        let mut kept = 0;
        for l in &out {
            prop_assert!(l.bytes.len() <= max);
            kept += l.bytes.len() + l.cut_bytes;
        }
        // What is not kept or cut is the newlines and at most one `\r` per line.
        let newlines = input.iter().filter(|b| **b == b'\n').count();
        prop_assert!(kept + newlines <= fed);
        prop_assert!(fed - (kept + newlines) <= out.len());
    }
}
