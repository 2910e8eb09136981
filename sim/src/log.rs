//! The event log of one run: every input fed to the engine, every effect it returned, every
//! crash and restore, every clock jump. Hashed (FNV-1a over the `Debug` text) for the
//! determinism test, kept as text when a single seed is replayed.

use std::fmt::Write as _;

use crate::rng::Fnv;

/// What the log keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    /// Nothing (the seed sweep: fastest).
    Off,
    /// A running hash of every entry (the determinism test).
    Hash,
    /// The hash, and every entry as a line of text (replaying one seed).
    Text,
}

#[derive(Debug, Clone)]
pub struct EventLog {
    mode: LogMode,
    hash: Fnv,
    lines: Vec<String>,
}

impl EventLog {
    pub fn new(mode: LogMode) -> Self {
        EventLog {
            mode,
            hash: Fnv::default(),
            lines: Vec::new(),
        }
    }

    /// Whether entries are kept at all (check before building an expensive entry).
    pub fn on(&self) -> bool {
        self.mode != LogMode::Off
    }

    /// Appends one entry.
    pub fn entry(&mut self, args: std::fmt::Arguments<'_>) {
        match self.mode {
            LogMode::Off => {}
            LogMode::Hash => {
                let _ = self.hash.write_fmt(args);
                self.hash.bytes(b"\n");
            }
            LogMode::Text => {
                let line = args.to_string();
                self.hash.bytes(line.as_bytes());
                self.hash.bytes(b"\n");
                self.lines.push(line);
            }
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash.finish()
    }

    /// The last `n` entries (text mode only).
    pub fn tail(&self, n: usize) -> Vec<String> {
        let start = self.lines.len().saturating_sub(n);
        self.lines[start..].to_vec()
    }
}

/// Logs one entry if the log is on; the arguments are not even formatted otherwise.
#[macro_export]
macro_rules! log_entry {
    ($log:expr, $($arg:tt)*) => {
        if $log.on() {
            $log.entry(format_args!($($arg)*));
        }
    };
}
