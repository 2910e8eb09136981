//! The hub's channels: how a subscription is read ([`hear`], [`Heard`]), and a keyed fan-out
//! ([`Fanout`]): what the hub publishes for one key (a session, a task) reaches that key's
//! subscribers only.
//!
//! A watcher of one session must cost nothing when other sessions are busy, and must never
//! fall behind because of them. With one channel for every session's activities, each watcher
//! woke for every event of every session (20 watchers × 10,000 events/s: 200,000 wake-ups a
//! second to throw nearly all away), and a quiet session's watcher was dropped as lagging when
//! the others wrote more than its buffer while it waited for a core. Here each subscriber has
//! a bounded queue of its own (allocated as it fills, so an idle one costs a few words), and a
//! publish touches only the subscribers of its key.
//!
//! The lag rule is the hub's ([`Heard::Behind`]): a subscriber whose queue is full misses the
//! event, counted; its next receive says how many it missed before anything else, and it
//! reads them from the store (where everything published was committed first).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{broadcast, mpsc};

/// What one receive from a hub subscription gave.
#[derive(Debug)]
pub enum Heard<T> {
    Event(T),
    /// The subscriber fell this many events behind the hub: they are gone from its
    /// subscription (never from the store).
    Behind(u64),
    /// The hub is gone: the daemon is ending.
    Over,
}

/// Receives from a hub subscription: the one place a subscription's errors are read. What a
/// subscriber does when it is [`Heard::Behind`] is its own rule (see `api::watch`).
pub async fn hear<T: Clone>(sub: &mut broadcast::Receiver<T>) -> Heard<T> {
    match sub.recv().await {
        Ok(event) => Heard::Event(event),
        Err(broadcast::error::RecvError::Lagged(n)) => Heard::Behind(n),
        Err(broadcast::error::RecvError::Closed) => Heard::Over,
    }
}

/// Subscribers by key.
pub struct Fanout<K, T> {
    subs: Arc<Mutex<Subscribers<K, T>>>,
    capacity: usize,
}

impl<K, T> Clone for Fanout<K, T> {
    fn clone(&self) -> Self {
        Fanout {
            subs: self.subs.clone(),
            capacity: self.capacity,
        }
    }
}

struct Subscribers<K, T> {
    next_id: u64,
    by_key: HashMap<K, Vec<Entry<T>>>,
}

struct Entry<T> {
    id: u64,
    tx: mpsc::Sender<T>,
    /// Events this subscriber missed since its last receive (its queue was full).
    missed: Arc<AtomicU64>,
}

/// One subscriber's end: events of its key, in the order they were published.
pub struct Subscription<K: Hash + Eq, T> {
    rx: mpsc::Receiver<T>,
    missed: Arc<AtomicU64>,
    key: K,
    id: u64,
    subs: Weak<Mutex<Subscribers<K, T>>>,
}

fn lock<K, T>(subs: &Mutex<Subscribers<K, T>>) -> std::sync::MutexGuard<'_, Subscribers<K, T>> {
    // A publisher that panicked left the map whole (no step of it can leave it half-done).
    subs.lock().unwrap_or_else(|e| e.into_inner())
}

impl<K: Hash + Eq + Clone, T: Clone> Fanout<K, T> {
    /// A fan-out whose subscribers each queue at most `capacity` events.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a subscriber must be able to queue an event");
        Fanout {
            subs: Arc::new(Mutex::new(Subscribers {
                next_id: 0,
                by_key: HashMap::new(),
            })),
            capacity,
        }
    }

    /// Subscribes to `key`'s events from now on.
    pub fn subscribe(&self, key: &K) -> Subscription<K, T> {
        let (tx, rx) = mpsc::channel(self.capacity);
        let missed = Arc::new(AtomicU64::new(0));
        let mut subs = lock(&self.subs);
        let id = subs.next_id;
        subs.next_id += 1;
        subs.by_key.entry(key.clone()).or_default().push(Entry {
            id,
            tx,
            missed: missed.clone(),
        });
        Subscription {
            rx,
            missed,
            key: key.clone(),
            id,
            subs: Arc::downgrade(&self.subs),
        }
    }

    /// Gives a copy of `event` to every subscriber of `key` (none made when there is none);
    /// one whose queue is full misses it (counted, and told at its next receive). Never waits.
    pub fn publish(&self, key: &K, event: &T) {
        let mut subs = lock(&self.subs);
        let Some(entries) = subs.by_key.get_mut(key) else {
            return;
        };
        for e in entries.iter() {
            // Once behind, a subscriber takes nothing more until it has been told: what it
            // holds stays a gap-free prefix of what was published.
            if e.missed.load(Ordering::Acquire) > 0 {
                e.missed.fetch_add(1, Ordering::AcqRel);
                continue;
            }
            if let Err(mpsc::error::TrySendError::Full(_)) = e.tx.try_send(event.clone()) {
                e.missed.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// How many subscriptions are open.
    #[cfg(test)]
    fn subscribers(&self) -> usize {
        lock(&self.subs).by_key.values().map(Vec::len).sum()
    }
}

impl<K: Hash + Eq, T> Subscription<K, T> {
    /// The next event, or how many this subscriber missed (said first, once), or
    /// [`Heard::Over`] when the hub is gone.
    pub async fn hear(&mut self) -> Heard<T> {
        if let Some(n) = self.take_missed() {
            return Heard::Behind(n);
        }
        match self.rx.recv().await {
            Some(event) => Heard::Event(event),
            None => Heard::Over,
        }
    }

    /// An event already queued, if any (and if nothing was missed before it).
    pub fn try_recv(&mut self) -> Option<T> {
        if self.missed.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.rx.try_recv().ok()
    }

    /// Whether events were missed since the last [`Subscription::hear`] (the store has them).
    pub fn behind(&self) -> bool {
        self.missed.load(Ordering::Acquire) > 0
    }

    fn take_missed(&mut self) -> Option<u64> {
        match self.missed.swap(0, Ordering::AcqRel) {
            0 => None,
            n => {
                // What is queued came before the gap; the subscriber reads the gap (and so
                // those too) from the store.
                while self.rx.try_recv().is_ok() {}
                Some(n)
            }
        }
    }
}

impl<K: Hash + Eq, T> Drop for Subscription<K, T> {
    fn drop(&mut self) {
        let Some(subs) = self.subs.upgrade() else {
            return;
        };
        let mut subs = lock(&subs);
        if let Some(entries) = subs.by_key.get_mut(&self.key) {
            entries.retain(|e| e.id != self.id);
            if entries.is_empty() {
                subs.by_key.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_subscriber_hears_its_key_only_in_order() {
        let hub = Fanout::<&str, u32>::new(8);
        let mut a = hub.subscribe(&"a");
        let mut b = hub.subscribe(&"b");
        for n in 0..5 {
            hub.publish(&"a", &n);
        }
        hub.publish(&"b", &100);
        for n in 0..5 {
            assert!(matches!(a.hear().await, Heard::Event(m) if m == n));
        }
        assert!(a.try_recv().is_none());
        assert!(matches!(b.hear().await, Heard::Event(100)));
    }

    #[tokio::test]
    async fn a_busy_key_never_puts_another_keys_subscriber_behind() {
        let hub = Fanout::<&str, u32>::new(4);
        let mut quiet = hub.subscribe(&"quiet");
        let _busy = hub.subscribe(&"busy");
        for n in 0..10_000 {
            hub.publish(&"busy", &n);
        }
        hub.publish(&"quiet", &7);
        assert!(matches!(quiet.hear().await, Heard::Event(7)));
    }

    #[tokio::test]
    async fn a_full_subscriber_is_told_how_many_it_missed_then_hears_on() {
        let hub = Fanout::<&str, u32>::new(2);
        let mut s = hub.subscribe(&"a");
        for n in 0..5 {
            hub.publish(&"a", &n);
        }
        // 0 and 1 were queued, 2..5 missed: told first, the queued prefix dropped with it.
        assert!(matches!(s.hear().await, Heard::Behind(3)));
        assert!(s.try_recv().is_none());
        hub.publish(&"a", &5);
        assert!(matches!(s.hear().await, Heard::Event(5)));
    }

    #[tokio::test]
    async fn a_dropped_subscription_leaves_nothing_and_the_hubs_end_is_heard() {
        let hub = Fanout::<&str, u32>::new(2);
        let s = hub.subscribe(&"a");
        let mut t = hub.subscribe(&"a");
        assert_eq!(hub.subscribers(), 2);
        drop(s);
        assert_eq!(hub.subscribers(), 1);
        hub.publish(&"nobody", &1);
        drop(hub);
        assert!(matches!(t.hear().await, Heard::Over));
    }
}
