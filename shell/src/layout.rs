//! Architecture Invariant: no import cycle between the top-level modules of any of the
//! shell's crates (`paddock`'s `api` and `serve`; the daemon's, agents', environments',
//! runner's, OS seam's, store's and support's), so the arrows that ARCHITECTURE.md draws are
//! the ones the code has, and each module could become a crate (`providers`, `env`, `runner`,
//! `daemon` and the process library did). Between crates, Cargo itself refuses a cycle.
//!
//! The test reads the sources (non-test code: comments, `#[cfg(test)] mod` tails and `tests.rs`
//! files are left out), collects every `crate::m` / `crate::{m, …}` path (and `super::m` in a
//! top-level module's own file), and finds the strongly connected components of the module
//! graph. The cycles that are still being cut (issue 11 point 8) are listed in
//! [`KNOWN_CYCLES`]; any other cycle fails, and so does a listed one that is gone, so the list
//! only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Cycles present today, each as its sorted module names: none (the last, `api ↔ daemon`,
/// went when the composition root moved to `serve`).
const KNOWN_CYCLES: &[&[&str]] = &[];

/// Cycles between the files (and sub-directories) of one top-level module's directory, each
/// as the directory and its sorted member names: none (the last, providers' bridge ↔ mcp ↔
/// claude_stream, went when `ClientTool` moved to `mcp` and `mcp` wrote its control error
/// with the codec).
const KNOWN_FILE_CYCLES: &[(&str, &[&str])] = &[];

/// The shell's crates (relative to `shell/`), each checked the same way: the modules of its
/// `src` (a crate split off the shell was one of its top-level modules: its files are now the
/// crate's top-level modules) and the files of each module's directory.
const CRATES: &[&str] = &[
    "src",
    "agents/src",
    "cli/src",
    "config/src",
    "daemon/src",
    "exec/src",
    "env/src",
    "runner/src",
    "sys/src",
    "store/src",
    "support/src",
];

/// How deep the source tree is walked (`src/api/…/x.rs`); the shell's is three levels.
const DEPTH_MAX: usize = 8;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module names that `path` names after `prefix` (`crate::`): `crate::daemon::Handle`
/// gives `daemon`; `crate::{cli, store::Store}` gives `cli` and `store`.
fn references(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Names at the group's own level: after `{` and after each `,` at depth 0.
            let mut depth = 0usize;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start => {
                        out.push(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    out
}

/// A file's code without comment lines and without its `#[cfg(test)] mod` tail.
fn non_test_code(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_files(dir: &Path, depth: usize, out: &mut Vec<std::path::PathBuf>) {
    assert!(depth <= DEPTH_MAX, "{} is nested too deep", dir.display());
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, depth + 1, out);
        } else if p.extension().is_some_and(|e| e == "rs") && !p.ends_with("tests.rs") {
            out.push(p);
        }
    }
}

/// The graph of the crate rooted at `src`: top-level module → the top-level modules it uses.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, 0, &mut files);
    let top_of = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first);
        (!matches!(name, "lib" | "main")).then(|| name.to_string())
    };
    let tops: BTreeSet<String> = files.iter().filter_map(|p| top_of(p)).collect();
    let mut g = Graph::new();
    for p in &files {
        let Some(top) = top_of(p) else { continue };
        let code = non_test_code(&std::fs::read_to_string(p).expect("source"));
        let rel = p.strip_prefix(src).expect("under src");
        // `super::` is the crate root only in `src/m.rs` and `src/m/mod.rs`.
        let at_top = rel.components().count() == 1 || rel.ends_with(format!("{top}/mod.rs"));
        let mut used = references(&code, "crate::");
        if at_top {
            used.extend(references(&code, "super::"));
        }
        let entry = g.entry(top.clone()).or_default();
        entry.extend(used.into_iter().filter(|m| *m != top && tops.contains(m)));
    }
    g
}

/// The graphs of each top-level directory's members (its files, and its sub-directories taken
/// whole, `mod.rs` left out: a parent declares its children): member → the sibling members it
/// uses, through `super::m` (`super::super::m` one level down) or `crate::<dir>::m`.
fn member_graphs(src: &Path) -> BTreeMap<String, Graph> {
    let mut files = Vec::new();
    rust_files(src, 0, &mut files);
    let mut out: BTreeMap<String, Graph> = BTreeMap::new();
    for p in &files {
        let rel: Vec<String> = p
            .strip_prefix(src)
            .expect("under src")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect();
        // src/<dir>/<member>.rs, src/<dir>/<member>/….rs
        if rel.len() < 2 || rel[1] == "mod.rs" {
            continue;
        }
        let (dir, member) = (&rel[0], rel[1].trim_end_matches(".rs").to_string());
        let code = non_test_code(&std::fs::read_to_string(p).expect("source"));
        // What names this directory's members, from where the file is.
        let up = match rel.len() {
            2 => "super::".to_string(),
            3 if rel[2] == "mod.rs" => "super::".to_string(),
            n => "super::".repeat(n - 2),
        };
        let mut used = references(&code, &format!("crate::{dir}::"));
        // Only the exact depth: `super::super::x` is not this directory's `x` from one level up.
        let deeper = format!("{up}super::");
        used.extend(references(&code.replace(&deeper, "deeper::"), &up));
        out.entry(dir.clone())
            .or_default()
            .entry(member.clone())
            .or_default()
            .extend(used.into_iter().filter(|m| *m != member));
    }
    for g in out.values_mut() {
        let members: BTreeSet<String> = g.keys().cloned().collect();
        for used in g.values_mut() {
            used.retain(|m| members.contains(m));
        }
    }
    out
}

/// The strongly connected components with more than one module, each sorted.
fn cycles(g: &Graph) -> BTreeSet<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in g.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut out = BTreeSet::new();
    for (m, r) in &reaches {
        let comp: Vec<String> = reaches
            .iter()
            .filter(|(n, rn)| r.contains(n.as_str()) && rn.contains(m.as_str()))
            .map(|(n, _)| n.to_string())
            .collect();
        if comp.len() > 1 {
            out.insert(comp);
        }
    }
    out
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let shell = Path::new(env!("CARGO_MANIFEST_DIR"));
    let g = graph(&shell.join("src"));
    assert!(g.contains_key("api") && g.contains_key("serve"), "{g:?}");
    // The daemon was the shell's `daemon`: a crate of its own, which cannot name a protocol's
    // module (`api` → `daemon` is the only way the arrow can go).
    let daemon = graph(&shell.join("daemon/src"));
    assert!(daemon["event_loop"].contains("port"), "{daemon:?}");
    // The CLI was the shell's `cli`: its files are its crate's top-level modules now.
    let cli = graph(&shell.join("cli/src"));
    assert!(
        cli.contains_key("latis") && cli.contains_key("client"),
        "{cli:?}"
    );
    // The environments crate was the shell's `env`: its relay uses the drivers it runs through.
    let env = graph(&shell.join("env/src"));
    assert!(env["relay"].contains("kube"), "{env:?}");
    let found: BTreeSet<Vec<String>> = CRATES
        .iter()
        .flat_map(|dir| {
            cycles(&graph(&shell.join(dir)))
                .into_iter()
                .map(move |c| std::iter::once(dir.to_string()).chain(c).collect())
        })
        .collect();
    let known: BTreeSet<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(
        found, known,
        "the import cycles between a shell crate's top-level modules changed (each listed with \
         its crate's directory first); a new cycle must be cut, a cut one removed from \
         KNOWN_CYCLES"
    );
}

/// Architecture Invariant: no import cycle between the files of one module's directory but the
/// listed ones (the files of a directory are its layers: `agents/bridge/openai.rs` uses
/// `wire.rs`, never the other way), in every shell crate.
#[test]
fn no_import_cycle_between_the_files_of_a_module() {
    let shell = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graphs: BTreeMap<String, Graph> = CRATES
        .iter()
        .flat_map(|dir| {
            member_graphs(&shell.join(dir))
                .into_iter()
                .map(move |(m, g)| (format!("{}/{m}", dir.trim_end_matches("/src")), g))
        })
        .collect();
    assert!(
        graphs["agents/bridge"]["openai"].contains("wire"),
        "{:?}",
        graphs["agents/bridge"]
    );
    let found: BTreeSet<(String, Vec<String>)> = graphs
        .iter()
        .flat_map(|(dir, g)| cycles(g).into_iter().map(move |c| (dir.clone(), c)))
        .collect();
    let known: BTreeSet<(String, Vec<String>)> = KNOWN_FILE_CYCLES
        .iter()
        .map(|(d, c)| (d.to_string(), c.iter().map(|m| m.to_string()).collect()))
        .collect();
    assert_eq!(
        found, known,
        "the import cycles between a module's files changed; a new cycle must be cut, a cut one \
         removed from KNOWN_FILE_CYCLES"
    );
}

#[test]
fn paths_groups_and_cycles_are_seen() {
    let code = non_test_code(
        "use crate::{cli, store::Store, daemon::{a, b}};\n// crate::api\nlet x = crate::text::f();\n\
         let y = paddock::crate::no;\n#[cfg(test)]\nmod tests { use crate::runner; }",
    );
    assert_eq!(
        references(&code, "crate::"),
        ["cli", "store", "daemon", "text"]
    );
    let g: Graph = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "d")]
        .into_iter()
        .fold(Graph::new(), |mut g, (x, y)| {
            g.entry(x.into()).or_default().insert(y.into());
            g.entry(y.into()).or_default();
            g
        });
    assert_eq!(cycles(&g), BTreeSet::from([vec!["a".into(), "b".into()]]));
}

/// Architecture Invariant: a session's settings (`permissions`, `approval_timeout`,
/// `approval_default`, the agent's `command` line, its `client_tools`) are parsed from the string map only where a
/// `provider_config` comes in:
/// `paddock_core::ProviderConfig::parse` (create, restart, a stored row) and the bridges, which
/// are processes of their own and get the map in their environment. Anything else reads the
/// typed settings.
#[test]
fn settings_are_parsed_only_where_a_provider_config_comes_in() {
    let shell = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = shell.parent().expect("the repository");
    let allowed = [
        "core/src/provider_config.rs",
        "shell/agents/src/bridge/codex.rs",
        "shell/agents/src/bridge/gemini.rs",
        // This test names what it looks for.
        "shell/src/layout.rs",
    ];
    // The policy, the approval settings, the agent's command line, the client's tools.
    let found = non_test_code_containing(
        &[root.join("core/src")],
        &[
            "Policy::parse(",
            "ApprovalSettings::parse(",
            "shlex::split(",
            "get(CLIENT_TOOLS_KEY",
            "get(\"client_tools\"",
            "(crate::CLIENT_TOOLS_KEY)",
        ],
    );
    let found: Vec<_> = found
        .iter()
        .map(|(f, what)| (f.strip_prefix(root).expect("under the repository"), what))
        .filter(|(rel, _)| !allowed.iter().any(|a| *rel == Path::new(a)))
        .map(|(rel, what)| format!("{} calls {what}", rel.display()))
        .collect();
    assert!(found.is_empty(), "{found:#?}");
}

/// The files of the shell's crates (and `more` directories) whose non-test code contains one
/// of `needles`, with the needle (a file may be named once for each).
fn non_test_code_containing(
    more: &[std::path::PathBuf],
    needles: &[&'static str],
) -> Vec<(std::path::PathBuf, &'static str)> {
    let shell = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in more {
        rust_files(dir, 0, &mut files);
    }
    for dir in CRATES {
        rust_files(&shell.join(dir), 0, &mut files);
    }
    assert!(files.len() > 50, "{} files", files.len());
    let mut found = Vec::new();
    for f in files {
        let code = non_test_code(&std::fs::read_to_string(&f).expect("readable"));
        for needle in needles {
            if code.contains(needle) {
                found.push((f.clone(), *needle));
            }
        }
    }
    found
}

/// Architecture Invariant: a client (the CLI, sunbeam's and Aria's adapters) tells an error by
/// its OBEY code, read from the status's `google.rpc.ErrorInfo`, never by matching the message
/// text. A message may be reworded; a code is part of the contract.
#[test]
fn no_code_matches_an_error_by_its_message_text() {
    let found: Vec<_> = non_test_code_containing(
        &[],
        &[
            "starts_with(\"OBEY",
            "contains(\"OBEY",
            "find(\"OBEY",
            "strip_prefix(\"OBEY",
        ],
    )
    .into_iter()
    .filter(|(f, _)| !f.ends_with("layout.rs")) // names what it looks for
    .map(|(f, call)| format!("{} matches {call}…", f.display()))
    .collect();
    assert!(found.is_empty(), "{found:#?}");
}
