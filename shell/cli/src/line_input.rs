//! The terminal side of a line conversation (`session attach`): lines typed by a person while
//! the agent's output streams above them.
//!
//! On a terminal (stdin, stdout and stderr), lines are read with reedline — cursor editing,
//! in-memory history (Up/Down), pasting, Ctrl-C / Ctrl-D — and everything printed meanwhile
//! goes through its external printer, so output appears above the line being typed and the
//! prompt stays below it. Elsewhere (a pipe, a file), lines are read plainly, at most
//! [`LINE_MAX_BYTES`] each. Either way the reading happens on a thread of its own, which hands
//! [`Typed`] items over a bounded channel: a blocking read never holds the async runtime.
//! When the conversation ends while the editor still waits for a line, [`Screen::close`] lets
//! it print what it was given, then breaks its read: the terminal is left as it was found.

use std::borrow::Cow;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reedline::{Prompt, PromptEditMode, PromptHistorySearch, Reedline, Signal};
use tokio::sync::mpsc;

/// A typed line is at most this long (a message is text a person types).
pub const LINE_MAX_BYTES: usize = 64 * 1024;
/// How often the editor looks for lines to print while it waits for keys (reedline's default
/// is 100 ms; output should feel live).
const EDITOR_POLL: Duration = Duration::from_millis(25);
/// Lines waiting for the editor to print them; past it, printing waits (at most a poll).
const PRINT_QUEUE: usize = 256;
/// How long [`Screen::close`] waits for the editor to print and to end, at most.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What the input thread read.
#[derive(Debug, PartialEq, Eq)]
pub enum Typed {
    Line(String),
    TooLong(usize),
    /// End of input: Ctrl-D on an empty line, Ctrl-C in the editor, or the end of a pipe.
    Eof,
    Failed(String),
}

/// Reads one line of at most `max` bytes (without its `\n` / `\r\n`); a longer one is read to
/// its end and reported as [`Typed::TooLong`].
pub fn read_line<R: BufRead>(r: &mut R, max: usize) -> Typed {
    let mut buf: Vec<u8> = Vec::new();
    let mut len = 0usize;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Typed::Failed(e.to_string()),
        };
        if chunk.is_empty() {
            if len == 0 {
                return Typed::Eof;
            }
            break;
        }
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        len += part.len();
        if len <= max {
            buf.extend_from_slice(part);
        }
        let used = done.unwrap_or(part.len());
        r.consume(used);
        if done.is_some() {
            break;
        }
    }
    if len > max {
        return Typed::TooLong(len);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Typed::Line(String::from_utf8_lossy(&buf).into_owned())
}

/// A line as the editor returned it, held to the same bound as a plain read.
fn bounded(line: String) -> Typed {
    match line.len() {
        n if n > LINE_MAX_BYTES => Typed::TooLong(n),
        _ => Typed::Line(line),
    }
}

/// `> `, uncoloured.
struct Arrow;

impl Prompt for Arrow {
    fn render_prompt_left(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn render_prompt_right(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn render_prompt_indicator(&self, _: PromptEditMode) -> Cow<'_, str> {
        Cow::Borrowed("> ")
    }
    fn render_prompt_multiline_indicator(&self) -> Cow<'_, str> {
        Cow::Borrowed("  ")
    }
    fn render_prompt_history_search_indicator(&self, search: PromptHistorySearch) -> Cow<'_, str> {
        Cow::Owned(format!("(search: {}) ", search.term))
    }
    fn get_prompt_color(&self) -> reedline::Color {
        reedline::Color::Default
    }
    fn get_indicator_color(&self) -> reedline::Color {
        reedline::Color::Default
    }
}

/// Where the conversation's output goes: above the line being edited while the editor reads,
/// else straight to stdout. Cheap to clone.
#[derive(Clone, Default)]
pub struct Screen {
    editor: Option<Arc<Editing>>,
    /// Stdout was closed (`paddock session attach … | head`): nobody sees the conversation.
    closed: Arc<AtomicBool>,
}

struct Editing {
    printer: SyncSender<String>,
    /// The editor thread still reads lines (it has not ended on Ctrl-D, Ctrl-C or an error).
    reading: Arc<AtomicBool>,
    /// Set to make the editor's read return (reedline clears it when it does).
    stop: Arc<AtomicBool>,
    /// The editor's wait loops so far: two more after a line was handed to the printer, and
    /// the line was printed (it prints what is queued once per loop).
    loops: Arc<AtomicU64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Screen {
    /// Starts reading lines into `tx`, with the editor when stdin and stdout are a terminal.
    pub fn start(tx: mpsc::Sender<Typed>) -> Screen {
        // reedline reads stdin and draws on stderr; the conversation prints on stdout.
        let terminal = std::io::stdin().is_terminal()
            && std::io::stdout().is_terminal()
            && std::io::stderr().is_terminal();
        if terminal {
            match start_editor(tx.clone()) {
                Ok(editing) => {
                    return Screen {
                        editor: Some(Arc::new(editing)),
                        closed: Arc::default(),
                    }
                }
                Err(e) => tracing::debug!("no line editor ({e}); reading plain lines"),
            }
        }
        start_plain(tx);
        Screen::default()
    }

    /// Prints one line (or several, separated by `\n`).
    pub fn say(&self, text: impl Into<String>) {
        let mut text = text.into();
        if let Some(e) = self
            .editor
            .as_ref()
            .filter(|e| e.reading.load(Ordering::SeqCst))
        {
            match e.printer.send(text) {
                Ok(()) => return,
                // The editor has ended: printed here.
                Err(back) => text = back.0,
            }
        }
        // A screen whose output was closed has no one to show it to: the caller ends.
        if let Err(crate::Error::StdoutClosed) = outln!("{text}") {
            self.closed.store(true, Ordering::SeqCst);
        }
    }

    /// Whether stdout was closed (a line could not be printed): time to go, quietly.
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The terminal bell (on a terminal only; the editor passes it through like any output).
    pub fn bell(&self) {
        super::output::bell();
    }

    /// The conversation is over: when the editor still reads, what it was given is printed,
    /// its read is broken and its thread ended, so the terminal is as it was found and the
    /// caller may print to it or use it otherwise (`paddock top` takes it back).
    pub fn close(&self) {
        let Some(e) = &self.editor else { return };
        let broken = e.reading.load(Ordering::SeqCst);
        if broken {
            let seen = e.loops.load(Ordering::SeqCst);
            let deadline = Instant::now() + CLOSE_WAIT;
            while e.loops.load(Ordering::SeqCst) < seen + 2 && Instant::now() < deadline {
                std::thread::sleep(EDITOR_POLL / 5);
            }
            e.stop.store(true, Ordering::SeqCst);
        }
        let thread = e.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let deadline = Instant::now() + CLOSE_WAIT;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(EDITOR_POLL / 5);
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        if broken {
            // The prompt the broken read left on the last line: cleared.
            let mut out = std::io::stdout();
            let _ = out.write_all(b"\r\x1b[2K").and_then(|()| out.flush());
        }
    }
}

fn start_editor(tx: mpsc::Sender<Typed>) -> std::io::Result<Editing> {
    let printer = reedline::ExternalPrinter::<String>::new(PRINT_QUEUE);
    let sender = printer.sender();
    let reading = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let loops = Arc::new(AtomicU64::new(0));
    let counted = loops.clone();
    let mut ed = Reedline::create()
        .with_external_printer(printer)
        .with_break_signal(stop.clone())
        .with_poll_interval(EDITOR_POLL)
        .with_idle_callback(Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }))
        .with_ansi_colors(std::env::var_os("NO_COLOR").is_none());
    let still = reading.clone();
    let thread = std::thread::Builder::new()
        .name("attach-editor".into())
        .spawn(move || loop {
            let t = match ed.read_line(&Arrow) {
                Ok(Signal::Success(line)) => bounded(line),
                // Ctrl-C and Ctrl-D both detach, as they do without the editor.
                Ok(Signal::CtrlC) | Ok(Signal::CtrlD) => Typed::Eof,
                // Broken by `close`: the conversation is already over.
                Ok(_) => {
                    still.store(false, Ordering::SeqCst);
                    return;
                }
                Err(e) => Typed::Failed(e.to_string()),
            };
            let last = matches!(t, Typed::Eof | Typed::Failed(_));
            if last {
                still.store(false, Ordering::SeqCst);
            }
            if tx.blocking_send(t).is_err() || last {
                still.store(false, Ordering::SeqCst);
                return;
            }
        })?;
    Ok(Editing {
        printer: sender,
        reading,
        stop,
        loops,
        thread: Mutex::new(Some(thread)),
    })
}

fn start_plain(tx: mpsc::Sender<Typed>) {
    let spawned = std::thread::Builder::new()
        .name("attach-stdin".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            let mut lock = stdin.lock();
            loop {
                let t = read_line(&mut lock, LINE_MAX_BYTES);
                let last = matches!(t, Typed::Eof | Typed::Failed(_));
                if tx.blocking_send(t).is_err() || last {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        // Without a reader the conversation is read-only; say why (the caller still runs).
        eprintln!("error: cannot read the terminal: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_bounded() {
        let mut r = std::io::Cursor::new(b"hello\r\nworld\nlast".to_vec());
        assert_eq!(read_line(&mut r, 10), Typed::Line("hello".into()));
        assert_eq!(read_line(&mut r, 10), Typed::Line("world".into()));
        assert_eq!(read_line(&mut r, 10), Typed::Line("last".into()));
        assert_eq!(read_line(&mut r, 10), Typed::Eof);

        // A long line is read to its end and refused; the next one is whole.
        let mut r = std::io::BufReader::with_capacity(
            4,
            std::io::Cursor::new(b"0123456789abc\nok\n\n".to_vec()),
        );
        assert_eq!(read_line(&mut r, 10), Typed::TooLong(13));
        assert_eq!(read_line(&mut r, 10), Typed::Line("ok".into()));
        assert_eq!(read_line(&mut r, 10), Typed::Line(String::new()));
        assert_eq!(read_line(&mut r, 10), Typed::Eof);
        let mut r = std::io::Cursor::new(b"\xff\xfeab\n".to_vec());
        assert_eq!(
            read_line(&mut r, 10),
            Typed::Line("\u{fffd}\u{fffd}ab".into())
        );

        // The editor's lines have the same bound.
        assert_eq!(bounded("ok".into()), Typed::Line("ok".into()));
        let long = "x".repeat(LINE_MAX_BYTES + 1);
        assert_eq!(bounded(long), Typed::TooLong(LINE_MAX_BYTES + 1));
    }
}
