//! The runs a runner knows, and each run's numbered events in a bounded buffer.
//!
//! One log per run is the single source of every stream: the stream of the `Exec` /
//! `ExecResume` / `RunCommand` call that started the run and every `AttachRun` are all readers
//! ("cursors") of the same log, so a client that lost its stream (a daemon restart) gets the
//! same events, with the same numbers, from where it left off.
//!
//! # The buffer and its limits
//!
//! Events are numbered 1, 2, 3, … per run (`RunnerEvent.seq`). A run's log holds the events
//! its client has not acknowledged (`AckRun`: "stored up to seq"; see [`Run::ack`]): what the
//! client has stored is dropped, so a run whose client keeps up holds next to nothing. Whatever
//! is unacknowledged is bounded too: at most [`Limits::events_per_run`] (10,000) and
//! [`Limits::bytes_per_run`] (8 MiB, counted as encoded protobuf), whichever is reached first;
//! older events are dropped from the front. Dropping is held back while a connected reader still has to read the oldest event:
//! then the producer (the task reading the child's output) waits, which stops reading the
//! child's pipe, which blocks the child's writes. So a connected client never loses an event
//! and a slow one slows the child down (as a pipe would), while memory stays bounded. A reader
//! that asks for events already dropped (`after_seq` too old, or a client that was away) gets
//! one `EventsTruncated` marker (seq 0) saying what was skipped, then the events that remain.
//!
//! Per reader, at most [`READ_BATCH_BYTES`] are in flight between the log and its gRPC stream
//! (read when the stream is polled: a reader has no task of its own).
//!
//! Finished runs stay known (ListRuns, AttachRun, run-id uniqueness) for the last
//! [`Limits::finished_runs`] (1,000); beyond that the oldest is forgotten. Their buffered
//! events count against [`Limits::finished_bytes`] (64 MiB over all finished runs): past it the
//! oldest finished runs' events are dropped (their metadata stays). At most
//! [`Limits::live_runs`] runs run at once (`paddock runner --max-runs`; the daemon starts its
//! runner with its own session and task limits, and sets them again with `SetLimits` on a
//! runner a previous daemon started, so the runner never refuses what the daemon accepted).
//! The per-run bounds are `--buffer-events` / `--buffer-bytes` (the daemon's
//! `--runner-buffer-events` / `--runner-buffer-bytes`).
//!
//! Each run's process life is the core's [`RunMachine`]: the log's producer feeds it, and the
//! statuses it emits are the run's `RunStatus` events.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use paddock_core::run::{Effect, Input, Phase, Refusal, RunMachine, Status, StatusKind};
use paddock_proto::runner::v1::{
    runner_event::Payload, EventsTruncated, RunInfo, RunKind, RunState, RunStatus, RunnerEvent,
};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot, watch};

/// Every bound the registry enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Events kept per run.
    pub events_per_run: usize,
    /// Encoded bytes of events kept per run.
    pub bytes_per_run: usize,
    /// Finished runs remembered.
    pub finished_runs: usize,
    /// Encoded bytes of events kept over all finished runs.
    pub finished_bytes: usize,
    /// Runs whose process is live, at once.
    pub live_runs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            events_per_run: 10_000,
            bytes_per_run: 8 * 1024 * 1024,
            finished_runs: 1_000,
            finished_bytes: 64 * 1024 * 1024,
            live_runs: DEFAULT_LIVE_RUNS,
        }
    }
}

/// Live runs at most when nothing else is said (a runner started by hand).
pub const DEFAULT_LIVE_RUNS: usize = 1024;
/// The smallest per-run byte bound: one largest chunk (64 KiB) must always fit.
pub const MIN_BUFFER_BYTES: usize = 64 * 1024;

/// Bytes a reader takes from the log in one go (at least one event).
pub const READ_BATCH_BYTES: usize = 1024 * 1024;

/// A request to the writer of a run's stdin.
#[derive(Debug)]
pub struct StdinMsg {
    pub data: Vec<u8>,
    pub close: bool,
    /// The write's outcome (the reply to the client says it in words).
    pub ack: oneshot::Sender<std::io::Result<()>>,
}

/// Why a run could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateError {
    AlreadyExists,
    TooManyRuns(usize),
}

/// Every run this runner knows.
pub struct Registry {
    inner: Mutex<Inner>,
}

struct Inner {
    /// Changed by `SetLimits` while runs run: read under the same lock as the counts.
    limits: Limits,
    runs: HashMap<String, Arc<Run>>,
    /// Finished runs, oldest first.
    finished: VecDeque<Arc<Run>>,
    live: usize,
    next_order: u64,
}

impl Registry {
    pub fn new(limits: Limits) -> Self {
        Registry {
            inner: Mutex::new(Inner {
                limits,
                runs: HashMap::new(),
                finished: VecDeque::new(),
                live: 0,
                next_order: 0,
            }),
        }
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits.clone()
    }

    /// Replaces the run limit and the per-run buffer bounds (`SetLimits`): the run limit holds
    /// from the next `create` (runs already live are never refused after the fact), the buffer
    /// bounds for runs created from now on. The limits in force are returned.
    pub fn set_limits(
        &self,
        live_runs: Option<usize>,
        events_per_run: Option<usize>,
        bytes_per_run: Option<usize>,
    ) -> Limits {
        let mut inner = self.lock();
        if let Some(n) = live_runs {
            inner.limits.live_runs = n.max(1);
        }
        if let Some(n) = events_per_run {
            inner.limits.events_per_run = n.max(1);
        }
        if let Some(n) = bytes_per_run {
            inner.limits.bytes_per_run = n.max(MIN_BUFFER_BYTES);
        }
        inner.limits.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new run (its process not started yet).
    pub fn create(
        &self,
        id: &str,
        kind: RunKind,
        working_dir: &str,
    ) -> Result<Arc<Run>, CreateError> {
        let mut inner = self.lock();
        if inner.runs.contains_key(id) {
            return Err(CreateError::AlreadyExists);
        }
        if inner.live >= inner.limits.live_runs {
            return Err(CreateError::TooManyRuns(inner.limits.live_runs));
        }
        inner.next_order += 1;
        let run = Arc::new(Run::new(
            id.to_string(),
            kind,
            working_dir.to_string(),
            inner.next_order,
            inner.limits.events_per_run,
            inner.limits.bytes_per_run,
        ));
        inner.runs.insert(id.to_string(), run.clone());
        inner.live += 1;
        Ok(run)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Run>> {
        self.lock().runs.get(id).cloned()
    }

    /// Every known run, oldest first.
    pub fn list(&self) -> Vec<RunInfo> {
        let mut runs: Vec<Arc<Run>> = self.lock().runs.values().cloned().collect();
        runs.sort_by_key(|r| r.order);
        runs.iter().map(|r| r.info()).collect()
    }

    /// Runs whose process has not ended.
    pub fn live(&self) -> Vec<Arc<Run>> {
        let mut runs: Vec<Arc<Run>> = self
            .lock()
            .runs
            .values()
            .filter(|r| !r.is_closed())
            .cloned()
            .collect();
        runs.sort_by_key(|r| r.order);
        runs
    }

    pub fn live_count(&self) -> usize {
        self.lock().live
    }

    /// Bookkeeping once `run` emitted its final status: it joins the finished runs, and the
    /// oldest finished runs are forgotten or lose their events to stay within the limits.
    pub fn finished(&self, run: &Arc<Run>) {
        let mut inner = self.lock();
        inner.live = inner.live.saturating_sub(1);
        inner.finished.push_back(run.clone());
        while inner.finished.len() > inner.limits.finished_runs {
            if let Some(old) = inner.finished.pop_front() {
                if inner
                    .runs
                    .get(&old.id)
                    .is_some_and(|r| Arc::ptr_eq(r, &old))
                {
                    inner.runs.remove(&old.id);
                }
            }
        }
        let mut total: usize = inner.finished.iter().map(|r| r.buffered_bytes()).sum();
        for old in inner.finished.iter() {
            if total <= inner.limits.finished_bytes {
                break;
            }
            total -= old.drop_events_if_unread();
        }
    }
}

/// One run: who it is, its process machine and its event log.
pub struct Run {
    pub id: String,
    pub kind: RunKind,
    pub working_dir: String,
    order: u64,
    max_events: usize,
    max_bytes: usize,
    st: Mutex<RunSt>,
    /// Bumped on every new event (and on close): wakes readers.
    data: watch::Sender<u64>,
    /// Bumped whenever a reader moves on or leaves: wakes a producer waiting for room.
    space: watch::Sender<u64>,
}

struct Stored {
    seq: u64,
    size: usize,
    /// Boxed: a `RunnerEvent` is 376 bytes, and a run's deque keeps its slots after a busy
    /// turn's events are acknowledged (32 unboxed slots were 12 KiB per idle run).
    event: Box<RunnerEvent>,
}

struct RunSt {
    machine: RunMachine,
    pid: u32,
    events: VecDeque<Stored>,
    bytes: usize,
    last_seq: u64,
    /// The client has stored every event up to this one (`AckRun`): they are not kept.
    acked: u64,
    /// The final status is in the log: nothing more comes.
    closed: bool,
    /// Reader id → the last seq handed to it.
    cursors: BTreeMap<u64, u64>,
    next_cursor: u64,
    stdin: Option<mpsc::Sender<StdinMsg>>,
    stdin_piped: bool,
    message: String,
}

impl RunSt {
    fn first_seq(&self) -> u64 {
        self.events.front().map_or(self.last_seq + 1, |e| e.seq)
    }

    /// Drops the acknowledged events every connected reader has read (a second reader that
    /// is behind still gets them: the client's acknowledgement speaks for what it stored, not
    /// for another stream). Returns whether anything was dropped.
    fn drop_acked(&mut self) -> bool {
        let min_read = self.cursors.values().copied().min().unwrap_or(u64::MAX);
        let upto = self.acked.min(min_read);
        let mut dropped = false;
        while self.events.front().is_some_and(|e| e.seq <= upto) {
            if let Some(old) = self.events.pop_front() {
                self.bytes -= old.size;
                dropped = true;
            }
        }
        // A busy turn grows the deque to thousands of slots; once its client caught up, an
        // idle run should not keep them (the capacity is what costs memory per idle run).
        let cap = self.events.capacity();
        if dropped && cap > 64 && self.events.len() <= cap / 8 {
            self.events.shrink_to((self.events.len() * 2).max(8));
        }
        dropped
    }

    /// How many of the oldest events must go to make room for `size` more bytes; `None` if
    /// one of them is still unread by a connected reader.
    fn evictions_for(&self, size: usize, max_events: usize, max_bytes: usize) -> Option<usize> {
        let min_read = self.cursors.values().copied().min().unwrap_or(u64::MAX);
        let mut n = 0;
        let mut bytes = self.bytes;
        while n < self.events.len()
            && (self.events.len() - n >= max_events || bytes + size > max_bytes)
        {
            let oldest = &self.events[n];
            if min_read < oldest.seq {
                return None;
            }
            bytes -= oldest.size;
            n += 1;
        }
        Some(n)
    }
}

/// What one read took from the log.
struct Batch {
    events: Vec<RunnerEvent>,
    done: bool,
}

impl Run {
    fn new(
        id: String,
        kind: RunKind,
        working_dir: String,
        order: u64,
        max_events: usize,
        max_bytes: usize,
    ) -> Self {
        Run {
            id,
            kind,
            working_dir,
            order,
            max_events: max_events.max(1),
            max_bytes,
            st: Mutex::new(RunSt {
                machine: RunMachine::new(),
                pid: 0,
                events: VecDeque::new(),
                bytes: 0,
                last_seq: 0,
                acked: 0,
                closed: false,
                cursors: BTreeMap::new(),
                next_cursor: 0,
                stdin: None,
                stdin_piped: false,
                message: String::new(),
            }),
            data: watch::channel(0).0,
            space: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, RunSt> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ── getters ────────────────────────────────────────────────────────────

    pub fn info(&self) -> RunInfo {
        let st = self.lock();
        let (state, exit_code) = match st.machine.outcome() {
            Some(s) => (run_state(s.kind), s.exit_code),
            None if st.machine.phase() == Phase::Starting => (RunState::Unspecified, 0),
            None => (RunState::Started, 0),
        };
        let exited = st.machine.is_exited();
        RunInfo {
            run_id: self.id.clone(),
            kind: self.kind as i32,
            state: state as i32,
            pid: st.pid,
            exit_code,
            last_seq: st.last_seq,
            first_seq: st.events.front().map_or(0, |e| e.seq),
            message: st.message.clone(),
            stopping: st.machine.is_stopping() && !exited,
            stdin_open: st.stdin.is_some() && !exited,
            working_dir: self.working_dir.clone(),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub fn last_seq(&self) -> u64 {
        self.lock().last_seq
    }

    fn buffered_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The next deadline of the run's machine.
    pub fn poll_timeout(&self) -> Option<paddock_core::Instant> {
        self.lock().machine.poll_timeout().map(|(at, _)| at)
    }

    // ── the machine ────────────────────────────────────────────────────────

    /// Feeds the run's machine. Signals are sent at once, to the process group; the statuses
    /// it emits are returned, for the caller to [`push_status`](Self::push_status) (in order).
    pub fn apply(&self, input: Input) -> Result<Vec<Status>, Refusal> {
        let mut st = self.lock();
        if let Input::Started { pid } = input {
            st.pid = pid;
        }
        let effects = st.machine.handle(input)?;
        let mut statuses = Vec::new();
        for effect in effects {
            match effect {
                Effect::Signal(sig) => paddock_sys::proc::signal_group(st.pid, sig),
                Effect::Emit(status) => statuses.push(status),
            }
        }
        if st.machine.is_exited() {
            st.stdin = None; // the writer task ends, closing the pipe
        }
        Ok(statuses)
    }

    // ── stdin ──────────────────────────────────────────────────────────────

    pub fn set_stdin(&self, tx: mpsc::Sender<StdinMsg>) {
        let mut st = self.lock();
        st.stdin = Some(tx);
        st.stdin_piped = true;
    }

    /// The stdin writer, taken out when `close` (later writes find it closed).
    pub fn stdin_for_write(&self, close: bool) -> Result<mpsc::Sender<StdinMsg>, &'static str> {
        let mut st = self.lock();
        if st.machine.is_exited() {
            return Err("already exited");
        }
        if !st.stdin_piped {
            return Err("stdin is not piped (start the run with keep_stdin)");
        }
        let tx = if close {
            st.stdin.take()
        } else {
            st.stdin.clone()
        };
        tx.ok_or("stdin is closed")
    }

    // ── the log ────────────────────────────────────────────────────────────

    /// Appends a status event (the final one closes the log).
    pub fn push_status(&self, status: &Status) -> impl std::future::Future<Output = ()> + '_ {
        let terminal = status.kind != StatusKind::Started;
        let event = self.event(Payload::Status(RunStatus {
            state: run_state(status.kind) as i32,
            exit_code: status.exit_code,
            message: status.message.clone(),
        }));
        self.push_inner(event, None, terminal, Some(status.message.clone()))
    }

    /// Appends one event of the child's output, waiting while the buffer is full of events a
    /// connected reader has not read yet.
    ///
    /// Not an `async fn`: the event is boxed before the future is made, so that the future
    /// (part of a reading task's state for the run's whole life) holds no 350-byte payload.
    pub fn push_output(
        &self,
        payload: Payload,
        bytes: u64,
    ) -> impl std::future::Future<Output = ()> + '_ {
        self.push_inner(self.event(payload), Some(bytes), false, None)
    }

    /// An event of this run, its seq not yet given.
    fn event(&self, payload: Payload) -> Box<RunnerEvent> {
        Box::new(RunnerEvent {
            run_id: self.id.clone(),
            payload: Some(payload),
            seq: 0,
        })
    }

    async fn push_inner(
        &self,
        mut event: Box<RunnerEvent>,
        output_bytes: Option<u64>,
        close: bool,
        message: Option<String>,
    ) {
        // The seq is not known yet; a u64 takes at most 11 bytes more once set.
        let size = event.encoded_len() + 11;
        let mut space = self.space.subscribe();
        loop {
            {
                // Mark the current `space` version seen before looking, so that a reader moving
                // on after this look wakes the wait below.
                space.borrow_and_update();
                let mut st = self.lock();
                if st.closed {
                    return; // nothing is appended after the final status
                }
                if let Some(n) = st.evictions_for(size, self.max_events, self.max_bytes) {
                    for _ in 0..n {
                        if let Some(old) = st.events.pop_front() {
                            st.bytes -= old.size;
                        }
                    }
                    st.last_seq += 1;
                    event.seq = st.last_seq;
                    let seq = st.last_seq;
                    st.events.push_back(Stored { seq, size, event });
                    st.bytes += size;
                    if let Some(bytes) = output_bytes {
                        let _ = st.machine.handle(Input::Output { bytes });
                    }
                    if let Some(m) = message {
                        st.message = m;
                    }
                    if close {
                        st.closed = true;
                    }
                    drop(st);
                    self.data.send_modify(|v| *v = v.wrapping_add(1));
                    return;
                }
            }
            if space.changed().await.is_err() {
                return; // cannot happen: `self` holds the sender
            }
        }
    }

    /// The client has stored every event up to `seq` (clamped to the newest): they are dropped
    /// once no connected reader still has to read them. Acknowledgements only move forward.
    /// Returns the oldest seq still held (0: none).
    pub fn ack(&self, seq: u64) -> u64 {
        let mut st = self.lock();
        let seq = seq.min(st.last_seq);
        if seq > st.acked {
            st.acked = seq;
            // Only events every reader has read go, so no waiting producer is concerned:
            // it waits for unread ones, and reading them wakes it.
            st.drop_acked();
        }
        st.events.front().map_or(0, |e| e.seq)
    }

    /// Drops every buffered event if no reader is connected; the bytes freed.
    fn drop_events_if_unread(&self) -> usize {
        let mut st = self.lock();
        if !st.cursors.is_empty() {
            return 0;
        }
        let freed = st.bytes;
        st.events.clear();
        st.bytes = 0;
        freed
    }

    /// A reader of the events after `after_seq` (clamped to the newest), registered now: from
    /// this moment the events it has not read are held for it.
    pub fn attach(self: &Arc<Self>, after_seq: u64) -> Reader {
        let mut st = self.lock();
        let id = st.next_cursor;
        st.next_cursor += 1;
        let from = after_seq.min(st.last_seq);
        st.cursors.insert(id, from);
        Reader {
            run: self.clone(),
            id,
        }
    }

    fn read_batch(&self, cursor: u64) -> Batch {
        let mut st = self.lock();
        let Some(&read) = st.cursors.get(&cursor) else {
            return Batch {
                events: Vec::new(),
                done: true,
            };
        };
        let mut events = Vec::new();
        let first = st.first_seq();
        let mut read = read;
        if read + 1 < first {
            events.push(RunnerEvent {
                run_id: self.id.clone(),
                payload: Some(Payload::Truncated(EventsTruncated {
                    first_dropped_seq: read + 1,
                    next_seq: first,
                    dropped: first - read - 1,
                })),
                seq: 0,
            });
            read = first - 1;
        }
        let start = (read + 1 - first) as usize;
        let mut bytes = 0;
        for stored in st.events.iter().skip(start) {
            if !events.is_empty() && bytes + stored.size > READ_BATCH_BYTES {
                break;
            }
            bytes += stored.size;
            events.push(RunnerEvent::clone(&stored.event));
            read = stored.seq;
        }
        st.cursors.insert(cursor, read);
        // Acknowledged events another reader held back may go now that it has read them.
        st.drop_acked();
        let done = st.closed && read >= st.last_seq;
        drop(st);
        if !events.is_empty() {
            self.space.send_modify(|v| *v = v.wrapping_add(1));
        }
        Batch { events, done }
    }

    fn detach(&self, cursor: u64) {
        let mut st = self.lock();
        st.cursors.remove(&cursor);
        st.drop_acked();
        drop(st);
        self.space.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// One registered reader of a run's log. Dropping it lets the log drop what it held for it.
pub struct Reader {
    run: Arc<Run>,
    id: u64,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.run.detach(self.id);
    }
}

impl Reader {
    /// The reader as a gRPC response stream: buffered events, then live ones, ending after the
    /// final status (or when the client goes away: tonic drops the stream, and with it the
    /// reader, which detaches).
    ///
    /// The events are read from the log as the client takes them, by the stream itself: no
    /// task and no channel per reader (a channel of `RunnerEvent`s took a 12 KiB block per
    /// run, ~12 MiB of the runner's memory with 1,000 agents), and a reader's cursor moves
    /// only as far as its client has read.
    pub fn into_stream(
        self,
    ) -> impl tokio_stream::Stream<Item = Result<RunnerEvent, tonic::Status>> + Send + 'static {
        let data = self.run.data.subscribe();
        let state = (self, data, Vec::new().into_iter(), false);
        futures_util::stream::unfold(
            state,
            |(reader, mut data, mut queue, mut done)| async move {
                loop {
                    if let Some(ev) = queue.next() {
                        return Some((Ok(ev), (reader, data, queue, done)));
                    }
                    if done {
                        return None;
                    }
                    data.borrow_and_update();
                    let batch = reader.run.read_batch(reader.id);
                    done = batch.done;
                    let empty = batch.events.is_empty();
                    // The batch read replaces the one drained, buffer and all: a reader
                    // waiting for output holds none (a reused queue kept its largest batch's).
                    queue = batch.events.into_iter();
                    if empty && !done && data.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
    }

    /// The next batch, for tests: the events and whether the log is done.
    #[cfg(test)]
    fn next(&self) -> (Vec<RunnerEvent>, bool) {
        let b = self.run.read_batch(self.id);
        (b.events, b.done)
    }
}

pub fn run_state(kind: StatusKind) -> RunState {
    match kind {
        StatusKind::Started => RunState::Started,
        StatusKind::Finished => RunState::Finished,
        StatusKind::Failed => RunState::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_proto::runner::v1::{CommandOutput, StreamKind};
    use std::time::Duration;

    fn small() -> Limits {
        Limits {
            events_per_run: 4,
            bytes_per_run: 1 << 20,
            finished_runs: 2,
            finished_bytes: 1 << 20,
            live_runs: 3,
        }
    }

    fn out(text: &str) -> Payload {
        Payload::CommandOutput(CommandOutput {
            stream: StreamKind::Stdout as i32,
            text: text.into(),
        })
    }

    fn seqs(events: &[RunnerEvent]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    async fn started(reg: &Registry, id: &str) -> Arc<Run> {
        let run = reg.create(id, RunKind::Command, "/").unwrap();
        for s in run.apply(Input::Started { pid: 0 }).unwrap() {
            run.push_status(&s).await;
        }
        run
    }

    /// `run`'s process exits with 0 and the registry is told.
    async fn exits(reg: &Registry, run: &Arc<Run>) {
        let statuses = run
            .apply(Input::Exited {
                code: Some(0),
                signal: None,
                detail: String::new(),
            })
            .unwrap();
        for s in &statuses {
            run.push_status(s).await;
        }
        reg.finished(run);
    }

    #[tokio::test]
    async fn without_readers_the_oldest_events_go_and_a_late_reader_is_told() {
        let reg = Registry::new(small());
        let run = started(&reg, "r").await;
        for i in 0..9 {
            run.push_output(out(&i.to_string()), 1).await;
        }
        assert_eq!(run.last_seq(), 10);
        assert_eq!(run.info().first_seq, 7, "4 kept: 7..=10");
        let r = run.attach(2);
        let (events, done) = r.next();
        assert!(!done);
        match &events[0].payload {
            Some(Payload::Truncated(t)) => {
                assert_eq!((t.first_dropped_seq, t.next_seq, t.dropped), (3, 7, 4));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(seqs(&events[1..]), vec![7, 8, 9, 10]);
        // From the middle of what is held: exactly the rest, no marker.
        let r2 = run.attach(8);
        assert_eq!(seqs(&r2.next().0), vec![9, 10]);
        // Past the newest: clamped, nothing yet.
        let r3 = run.attach(99);
        assert!(r3.next().0.is_empty());
    }

    #[tokio::test]
    async fn a_connected_reader_holds_the_producer_back_instead_of_losing_events() {
        let reg = Registry::new(small());
        let run = started(&reg, "r").await;
        let reader = run.attach(0);
        for i in 0..3 {
            run.push_output(out(&i.to_string()), 1).await;
        }
        // 4 events held (STARTED + 3), none read: the next push must wait.
        let producer = {
            let run = run.clone();
            tokio::spawn(async move { run.push_output(out("blocked"), 1).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!producer.is_finished());
        assert_eq!(run.last_seq(), 4);
        let (events, _) = reader.next();
        assert_eq!(seqs(&events), vec![1, 2, 3, 4]);
        tokio::time::timeout(Duration::from_secs(1), producer)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seqs(&reader.next().0), vec![5]);
        // A reader that leaves releases the producer too (5 is read; 6..=9 fill the log).
        for i in 0..4 {
            run.push_output(out(&i.to_string()), 1).await;
        }
        a_push_waits_until_dropped(&run, reader).await;
    }

    /// The log is full and `reader` holds it: a push waits, and goes once `reader` is dropped.
    async fn a_push_waits_until_dropped<R>(run: &Arc<Run>, reader: R) {
        let blocked = {
            let run = run.clone();
            tokio::spawn(async move { run.push_output(out("x"), 1).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!blocked.is_finished());
        drop(reader);
        tokio::time::timeout(Duration::from_secs(1), blocked)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_stream_reads_as_its_client_takes_and_a_dropped_one_lets_the_producer_go() {
        use tokio_stream::StreamExt as _;
        let reg = Registry::new(small());
        let run = started(&reg, "r").await;
        let mut stream = Box::pin(run.attach(0).into_stream());
        let next = |s: Option<Result<RunnerEvent, tonic::Status>>| s.unwrap().unwrap().seq;
        assert_eq!(next(stream.next().await), 1); // STARTED
                                                  // Nothing more yet: the stream waits, and wakes for the next event.
        let waiting = tokio::time::timeout(Duration::from_millis(30), stream.next()).await;
        assert!(waiting.is_err(), "no event yet: {waiting:?}");
        run.push_output(out("a"), 1).await;
        let got = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
        assert_eq!(next(got.unwrap()), 2);
        // The client has taken 2; the log holds 4 (small()): 3..=6 fill it, 7 waits for the
        // client, and dropping the stream (a client that went away) lets it go.
        for i in 0..4 {
            run.push_output(out(&i.to_string()), 1).await;
        }
        a_push_waits_until_dropped(&run, stream).await;
    }

    #[tokio::test]
    async fn the_final_status_closes_the_log_and_streams_end() {
        let reg = Registry::new(small());
        let run = started(&reg, "r").await;
        let reader = run.attach(0);
        run.push_output(out("hi"), 2).await;
        exits(&reg, &run).await;
        run.push_output(out("late"), 1).await; // dropped: closed
        let (events, done) = reader.next();
        assert_eq!(seqs(&events), vec![1, 2, 3]);
        assert!(done);
        let info = run.info();
        assert_eq!(info.state(), RunState::Finished);
        assert_eq!(info.last_seq, 3);
        assert_eq!(reg.live_count(), 0);

        use tokio_stream::StreamExt as _;
        let all: Vec<_> = run.attach(0).into_stream().collect().await;
        assert_eq!(all.len(), 3);
    }

    #[tokio::test]
    async fn ids_are_unique_while_known_and_finished_runs_are_forgotten() {
        let reg = Registry::new(small());
        let a = started(&reg, "a").await;
        assert_eq!(
            reg.create("a", RunKind::Exec, "/").err(),
            Some(CreateError::AlreadyExists)
        );
        let _b = started(&reg, "b").await;
        let _c = started(&reg, "c").await;
        assert_eq!(
            reg.create("d", RunKind::Exec, "/").err(),
            Some(CreateError::TooManyRuns(3))
        );
        for id in ["a", "b", "c"] {
            exits(&reg, &reg.get(id).unwrap()).await;
        }
        // Two finished runs are kept: "a" is forgotten and its id is free again.
        let ids: Vec<String> = reg.list().into_iter().map(|r| r.run_id).collect();
        assert_eq!(ids, vec!["b", "c"]);
        assert!(reg.get("a").is_none());
        drop(a);
        assert!(reg.create("a", RunKind::Exec, "/").is_ok());
    }

    #[tokio::test]
    async fn acknowledged_events_are_dropped_once_every_reader_has_read_them() {
        let reg = Registry::new(Limits {
            events_per_run: 10_000,
            ..small()
        });
        let run = started(&reg, "r").await;
        for i in 0..2_000 {
            run.push_output(out(&i.to_string()), 1).await;
        }
        let daemon = run.attach(0);
        let other = run.attach(0);
        let mut read = 0;
        while read < 2_001 {
            read += daemon.next().0.len();
        }
        // The client stored up to 1,500; the second reader has read nothing: all is kept.
        assert_eq!(run.ack(1_500), 1);
        assert_eq!(run.info().first_seq, 1);
        // It reads up to 1,000: those go; 1,001..=1,500 wait for it.
        let mut got = 0;
        while got < 1_000 {
            let (events, _) = other.next();
            got = events.last().map_or(got, |e| e.seq);
            if got >= 1_000 {
                break;
            }
        }
        assert!(run.info().first_seq > 1);
        drop(other);
        assert_eq!(
            run.info().first_seq,
            1_501,
            "the rest of the acknowledged ones went"
        );
        // Acknowledgements never go back, and are clamped to what exists.
        assert_eq!(run.ack(10), 1_501);
        assert_eq!(run.ack(u64::MAX), 0, "everything stored: nothing held");
        assert_eq!(run.info().last_seq, 2_001);
        {
            let st = run.lock();
            assert!(
                st.events.capacity() <= 64,
                "the deque shrank: {}",
                st.events.capacity()
            );
            assert_eq!(st.bytes, 0);
        }
        // New events are held until acknowledged; a reader from before the acknowledgement is
        // told what it cannot have.
        run.push_output(out("new"), 1).await;
        let late = run.attach(5);
        let (events, _) = late.next();
        match &events[0].payload {
            Some(Payload::Truncated(t)) => assert_eq!((t.next_seq, t.dropped), (2_002, 1_996)),
            other => panic!("{other:?}"),
        }
        assert_eq!(seqs(&events[1..]), vec![2_002]);
    }

    #[test]
    fn limits_can_be_raised_for_the_next_runs() {
        let reg = Registry::new(small());
        for id in ["a", "b", "c"] {
            reg.create(id, RunKind::Command, "/").unwrap();
        }
        assert_eq!(
            reg.create("d", RunKind::Command, "/").err(),
            Some(CreateError::TooManyRuns(3))
        );
        let now = reg.set_limits(Some(5), None, Some(1));
        assert_eq!(now.live_runs, 5);
        assert_eq!(now.events_per_run, 4, "unchanged");
        assert_eq!(now.bytes_per_run, MIN_BUFFER_BYTES, "never below one chunk");
        assert!(reg.create("d", RunKind::Command, "/").is_ok());
        // Lowered below what runs: nothing is refused after the fact, new runs are.
        reg.set_limits(Some(1), None, None);
        assert_eq!(reg.live_count(), 4);
        assert_eq!(
            reg.create("e", RunKind::Command, "/").err(),
            Some(CreateError::TooManyRuns(1))
        );
    }

    #[tokio::test]
    async fn finished_runs_share_a_byte_budget() {
        let reg = Registry::new(Limits {
            finished_bytes: 100,
            ..small()
        });
        let run = started(&reg, "a").await;
        run.push_output(out(&"x".repeat(200)), 200).await;
        exits(&reg, &run).await;
        let info = run.info();
        assert_eq!((info.first_seq, info.last_seq), (0, 3));
        let (events, done) = run.attach(0).next();
        assert!(matches!(events[0].payload, Some(Payload::Truncated(_))));
        assert!(done);
    }
}
