//! Watchers: a client's stream fed from the hub, for every protocol.
//!
//! The one lag rule: a subscriber that falls behind the hub never loses anything silently.
//! A watcher (obey's WatchSession/WatchAllSessions/WatchActivity/WatchApprovals, Aria's
//! StreamNotifications and task and container output) is told, with `RESOURCE_EXHAUSTED` and
//! the ErrorInfo reason `LAGGED` ([`lagged`]), and dropped: what it missed is stored (a
//! session's activities and statuses, a task's output, the requests), for its client to read
//! before it subscribes again. A stream that can read on from the store itself (a SendMessage
//! turn, an Execute, a sunbeam session) does that instead, at its client's pace.

use std::future::Future;

use tokio::sync::{broadcast, mpsc};
use tonic::{Code, Status};

use crate::daemon::{hear, Handle, Heard};

/// The ErrorInfo reason of a watcher that fell behind.
pub const LAGGED: &str = "LAGGED";

/// What a watcher that fell `n` events behind is told before it is dropped.
pub fn lagged(n: u64) -> Status {
    crate::transport::error_status(
        Code::ResourceExhausted,
        LAGGED,
        format!(
            "this stream fell {n} events behind and was dropped; what it missed is stored: \
             read it, then subscribe again"
        ),
    )
}

/// One watcher: where its events go, and the daemon whose end ends it.
pub struct Watcher<M> {
    tx: mpsc::Sender<Result<M, Status>>,
    handle: Handle,
}

impl<M> Watcher<M> {
    pub fn new(tx: mpsc::Sender<Result<M, Status>>, handle: Handle) -> Self {
        Watcher { tx, handle }
    }

    /// The next event of `sub`, or `None`: the watcher's end. The client went away, the daemon
    /// ends (after the events already queued are delivered), or the watcher fell behind
    /// (told so: [`Watcher::take`]).
    pub async fn next<T: Clone>(&self, sub: &mut broadcast::Receiver<T>) -> Option<T> {
        let heard = tokio::select! {
            biased;
            _ = self.tx.closed() => return None,
            heard = hear(sub) => heard,
            // Last: events already queued are delivered before the stream ends.
            _ = self.handle.closed() => return None,
        };
        self.take(heard).await
    }

    /// What a receive of the caller's own select gave (a watcher of several subscriptions):
    /// the event, or `None` after the lag rule was applied, or at the hub's end.
    pub async fn take<T>(&self, heard: Heard<T>) -> Option<T> {
        match heard {
            Heard::Event(event) => Some(event),
            Heard::Behind(n) => {
                self.fail(lagged(n)).await;
                None
            }
            Heard::Over => None,
        }
    }

    /// Sends one message; `false`: the client went away.
    pub async fn send(&self, message: M) -> bool {
        self.tx.send(Ok(message)).await.is_ok()
    }

    /// Ends the stream with `status`.
    pub async fn fail(&self, status: Status) {
        let _ = self.tx.send(Err(status)).await;
    }

    /// Resolves when the client went away (for a select of the caller's own).
    pub fn gone(&self) -> impl Future<Output = ()> + '_ {
        self.tx.closed()
    }

    /// Resolves when the daemon is done (for a select of the caller's own, last).
    pub fn daemon_done(&self) -> impl Future<Output = ()> + '_ {
        self.handle.closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::Hub;

    fn handle() -> (Handle, tokio::sync::watch::Sender<bool>) {
        let (tx, _rx) = mpsc::channel(1);
        let (done_tx, done) = tokio::sync::watch::channel(false);
        let handle = Handle {
            tx,
            hub: Hub::new(),
            done,
        };
        (handle, done_tx)
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_told_and_dropped() {
        let (handle, _done) = handle();
        let (events, mut sub) = broadcast::channel::<u32>(2);
        let (tx, mut rx) = mpsc::channel(8);
        let w = Watcher::<u32>::new(tx, handle);
        for n in 0..5 {
            events.send(n).unwrap();
        }
        assert_eq!(w.next(&mut sub).await, None, "dropped");
        let told = rx.recv().await.unwrap().unwrap_err();
        assert_eq!(told.code(), Code::ResourceExhausted);
        assert!(told.message().contains("fell 3 events behind"), "{told:?}");
        use tonic_types::StatusExt;
        let info = told.get_details_error_info().expect("an ErrorInfo");
        assert_eq!(info.reason, LAGGED);
    }

    #[tokio::test]
    async fn a_watcher_delivers_what_is_queued_then_ends_with_the_daemon_or_its_client() {
        let (handle, done) = handle();
        let (events, mut sub) = broadcast::channel::<u32>(8);
        let (tx, mut rx) = mpsc::channel(8);
        let w = Watcher::<u32>::new(tx, handle);
        events.send(7).unwrap();
        done.send(true).unwrap();
        // Queued before the end: delivered first.
        assert_eq!(w.next(&mut sub).await, Some(7));
        assert_eq!(w.next(&mut sub).await, None);
        drop(w);
        assert!(rx.recv().await.is_none(), "nothing more was sent");
        // A client that went away ends it too.
        let (handle, _done) = self::handle();
        let (tx, rx2) = mpsc::channel(8);
        let w = Watcher::<u32>::new(tx, handle);
        drop(rx2);
        events.send(8).unwrap();
        assert_eq!(w.next(&mut sub).await, None);
    }
}
