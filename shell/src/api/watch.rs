//! Watchers: a client's stream fed from the hub, for every protocol.
//!
//! The one lag rule: a subscriber that falls behind the hub never loses anything silently.
//! A stream of one owner's stored items reads on from the store, at its client's pace
//! ([`Watcher::follow_until`]: obey's WatchActivity, Aria's StreamTaskOutput; a SendMessage
//! turn, an Execute and a sunbeam session do the same their own way). A watcher of everything
//! (obey's WatchSession/WatchAllSessions/WatchApprovals, Aria's StreamNotifications and a
//! container's log) is told, with `RESOURCE_EXHAUSTED` and the ErrorInfo reason `LAGGED`
//! ([`lagged`]), and dropped: what it missed is stored (statuses, requests, a task's output),
//! for its client to read before it subscribes again.

use std::future::Future;

use tokio::sync::{broadcast, mpsc};
use tonic::{Code, Status};

use crate::daemon::fanout::Subscription;
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

    /// Follows one owner's items (a session's activities, a task's output) after `last`, the
    /// sequence number the store's read ended at (`items` was subscribed before that read, so
    /// nothing falls between; what the read already gave is skipped by its number), until the
    /// owner ends: `ended` picks its terminal status from `statuses`, and when statuses fell
    /// behind (its end may be among those passed over) `ended_now` asks the daemon whether the
    /// owner has ended (`None`: it cannot say, the daemon is going). `stored` reads a page of
    /// the owner's items after a sequence number, as for [`send_stored`].
    ///
    /// Such a stream never falls behind for good: everything of an owner is stored before it
    /// is published, so a subscription that fell behind reads on from the store. At the
    /// owner's end (told, and answered, after all of its items were published) what is queued
    /// is sent, and the stream ends. The client or the daemon's end end it sooner.
    #[allow(clippy::too_many_arguments)]
    pub async fn follow_until<K, T, S, F, G>(
        &self,
        items: &mut Subscription<K, T>,
        statuses: &mut broadcast::Receiver<S>,
        mut last: u64,
        mut stored: impl FnMut(u64) -> F,
        seq: impl Fn(&T) -> u64,
        ended: impl Fn(&S) -> bool,
        mut ended_now: impl FnMut() -> G,
        pb: impl Fn(&T) -> M,
    ) where
        K: std::hash::Hash + Eq,
        S: Clone,
        F: Future<Output = Result<Vec<T>, Status>>,
        G: Future<Output = Option<bool>>,
    {
        loop {
            let read_on = tokio::select! {
                biased;
                _ = self.gone() => return,
                heard = items.hear() => match heard {
                    Heard::Event(item) => {
                        if !self.forward(&item, &mut last, &seq, &pb).await {
                            return;
                        }
                        false
                    }
                    Heard::Behind(_) => true,
                    Heard::Over => return,
                },
                heard = hear(statuses) => {
                    let over = match heard {
                        Heard::Event(status) => ended(&status),
                        Heard::Behind(_) => match ended_now().await {
                            Some(over) => over,
                            None => return,
                        },
                        Heard::Over => return,
                    };
                    if over {
                        // Everything of the owner was published before its end: what is
                        // queued is the rest, or, if this fell behind meanwhile, the store
                        // has it (a daemon shutting down may be gone before a read: only
                        // then is the store asked).
                        while let Some(item) = items.try_recv() {
                            if !self.forward(&item, &mut last, &seq, &pb).await {
                                return;
                            }
                        }
                        if items.behind() {
                            send_stored(&self.tx, last, &mut stored, &seq, |i| Some(pb(i))).await;
                        }
                        return;
                    }
                    false
                }
                // Last: events already queued are delivered before the stream ends.
                _ = self.daemon_done() => return,
            };
            if read_on {
                match send_stored(&self.tx, last, &mut stored, &seq, |i| Some(pb(i))).await {
                    Some(read) => last = read,
                    None => return,
                }
            }
        }
    }

    /// Sends `item` if it is newer than `last`, which it then becomes; `false`: the client
    /// went away.
    async fn forward<T>(
        &self,
        item: &T,
        last: &mut u64,
        seq: impl Fn(&T) -> u64,
        pb: impl Fn(&T) -> M,
    ) -> bool {
        if seq(item) <= *last {
            return true;
        }
        *last = seq(item);
        self.send(pb(item)).await
    }
}

/// Sends what is stored after `last`, a page at a time (`page(after)` reads the next one; an
/// empty page is the end), each item as `pb` makes it (`None`: not one for this stream). The
/// sequence number the store's read ended at, or `None`: the client went away, or the read
/// failed and the client was told why.
pub async fn send_stored<T, M, F>(
    tx: &mpsc::Sender<Result<M, Status>>,
    mut last: u64,
    mut page: impl FnMut(u64) -> F,
    seq: impl Fn(&T) -> u64,
    pb: impl Fn(&T) -> Option<M>,
) -> Option<u64>
where
    F: Future<Output = Result<Vec<T>, Status>>,
{
    loop {
        let items = match page(last).await {
            Ok(items) => items,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return None;
            }
        };
        if items.is_empty() {
            return Some(last);
        }
        for item in &items {
            last = seq(item);
            if let Some(message) = pb(item) {
                tx.send(Ok(message)).await.ok()?;
            }
        }
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

    /// A store of items 1..=n read in pages of two, as [`send_stored`] reads one.
    fn store(n: u64) -> impl FnMut(u64) -> std::future::Ready<Result<Vec<u64>, Status>> {
        move |after| std::future::ready(Ok((after + 1..=n).take(2).collect()))
    }

    async fn received(rx: &mut mpsc::Receiver<Result<u64, Status>>) -> Vec<u64> {
        let mut got = Vec::new();
        while let Some(m) = rx.recv().await {
            got.push(m.unwrap());
        }
        got
    }

    /// Follows owner 1 of `sub` after `last` until its end, `(1, true)` on `stat`, with items
    /// 1..=`stored` in the store, each sent as `pb` makes it; what the client received.
    async fn follow_one<G: Future<Output = Option<bool>>>(
        sub: &mut Subscription<u32, u64>,
        stat: &mut broadcast::Receiver<(u32, bool)>,
        last: u64,
        stored: u64,
        ended_now: impl FnMut() -> G,
        pb: impl Fn(&u64) -> u64,
    ) -> Vec<u64> {
        let (handle, _done) = handle();
        let (tx, mut rx) = mpsc::channel(16);
        let w = Watcher::<u64>::new(tx, handle);
        let ended = |s: &(u32, bool)| s.0 == 1 && s.1;
        let follow = w.follow_until(sub, stat, last, store(stored), |n| *n, ended, ended_now, pb);
        tokio::time::timeout(std::time::Duration::from_secs(10), follow)
            .await
            .expect("the follower ends with its owner");
        drop(w);
        received(&mut rx).await
    }

    /// For a follower that missed no status: it has nothing to ask.
    fn never_asked() -> std::future::Ready<Option<bool>> {
        panic!("no status was missed: nothing to ask")
    }

    #[tokio::test]
    async fn following_skips_what_the_store_gave_and_ends_with_its_owner() {
        let items = crate::daemon::fanout::Fanout::<u32, u64>::new(8);
        let (statuses, mut stat) = broadcast::channel::<(u32, bool)>(8);
        let mut sub = items.subscribe(&1);
        for seq in 1..=4 {
            items.publish(&1, &seq);
        }
        items.publish(&2, &9);
        // Another owner's end and this one's progress are passed over; its end ends the
        // stream, after what is queued (the store is not read: 5 is not sent).
        statuses.send((2, true)).unwrap();
        statuses.send((1, false)).unwrap();
        statuses.send((1, true)).unwrap();
        let got = follow_one(&mut sub, &mut stat, 2, 5, never_asked, |n| n * 10).await;
        assert_eq!(got, [30, 40], "after the stored 2, this owner's only");
    }

    #[tokio::test]
    async fn a_follower_that_fell_behind_reads_on_from_the_store() {
        let items = crate::daemon::fanout::Fanout::<u32, u64>::new(2);
        let (statuses, mut stat) = broadcast::channel::<(u32, bool)>(8);
        let mut sub = items.subscribe(&1);
        for seq in 1..=7 {
            items.publish(&1, &seq);
        }
        statuses.send((1, true)).unwrap();
        let got = follow_one(&mut sub, &mut stat, 0, 7, never_asked, |n| *n).await;
        assert_eq!(
            got,
            (1..=7).collect::<Vec<_>>(),
            "each once, in order, none lost"
        );
    }

    /// The owner's end among the statuses a follower fell behind on: it asks, and ends.
    #[tokio::test]
    async fn an_end_among_missed_statuses_is_asked_for() {
        let items = crate::daemon::fanout::Fanout::<u32, u64>::new(8);
        let (statuses, mut stat) = broadcast::channel::<(u32, bool)>(2);
        let mut sub = items.subscribe(&1);
        items.publish(&1, &1);
        items.publish(&1, &2);
        // Owner 1's end, then more of others than the status channel holds: it is lost.
        statuses.send((1, true)).unwrap();
        for other in 2..6 {
            statuses.send((other, true)).unwrap();
        }
        let asks = std::cell::Cell::new(0);
        let asked = || {
            asks.set(asks.get() + 1);
            std::future::ready(Some(true))
        };
        let got = follow_one(&mut sub, &mut stat, 0, 2, asked, |n| *n).await;
        assert_eq!(got, [1, 2], "what was queued, then the end");
        assert_eq!(asks.get(), 1);
    }
}
