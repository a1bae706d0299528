//! A prefill's rooms: the KV it "computed" for each `bootstrap_room`, held until the decode ranks
//! have pulled it. A decode may ask before the prefill has seen the request (the gateway sends
//! both at once), so a room comes into being on whichever side arrives first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How long a room stays after it was created; pulls come within seconds of the prefill.
pub const ROOM_KEEP: Duration = Duration::from_secs(60);

struct Room {
    ready: watch::Sender<Option<u64>>,
    pulls: watch::Sender<u64>,
    created: Instant,
}

impl Room {
    fn new() -> Self {
        Self { ready: watch::Sender::new(None), pulls: watch::Sender::new(0), created: Instant::now() }
    }
}

#[derive(Default)]
pub struct Rooms {
    inner: Mutex<HashMap<u64, Room>>,
}

/// SGLang's text for a room that timed out in a transfer state.
pub fn timed_out(room: u64, since: Instant, state: &str) -> String {
    format!("Request {room} timed out after {:.1}s in KVPoll.{state}", since.elapsed().as_secs_f64())
}

impl Rooms {
    fn with<T>(&self, room: u64, f: impl FnOnce(&Room) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(room).or_insert_with(Room::new))
    }

    /// The prefill has computed `tokens` of KV for `room`.
    pub fn set_ready(&self, room: u64, tokens: u64) {
        self.with(room, |r| r.ready.send_replace(Some(tokens)));
    }

    /// Waits until the room is computed; the answer is its token count.
    pub async fn wait_ready(&self, room: u64, timeout: Duration) -> Result<u64, String> {
        let mut rx = self.with(room, |r| r.ready.subscribe());
        let start = Instant::now();
        match tokio::time::timeout(timeout, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => Ok(v.unwrap_or_default()),
            _ => Err(timed_out(room, start, "Bootstrapping")),
        }
    }

    /// One decode rank's pull of the room finished.
    pub fn pulled(&self, room: u64) {
        self.with(room, |r| r.pulls.send_modify(|n| *n += 1));
    }

    /// Waits until a decode rank has pulled the room (SGLang's prefill answers once its KV is
    /// sent); times out in `KVPoll.Bootstrapping` when no decode ever comes.
    pub async fn wait_pulled(&self, room: u64, timeout: Duration) -> Result<(), String> {
        let mut rx = self.with(room, |r| r.pulls.subscribe());
        let start = Instant::now();
        match tokio::time::timeout(timeout, rx.wait_for(|n| *n > 0)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(timed_out(room, start, "Bootstrapping")),
        }
    }

    /// Drops rooms older than `keep`.
    pub fn sweep(&self, keep: Duration) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, r| r.created.elapsed() <= keep);
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pull_may_come_before_the_prefill() {
        let rooms = std::sync::Arc::new(Rooms::default());
        let r2 = rooms.clone();
        let waiter = tokio::spawn(async move { r2.wait_ready(5, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        rooms.set_ready(5, 42);
        assert_eq!(waiter.await.unwrap(), Ok(42));
        rooms.pulled(5);
        assert_eq!(rooms.wait_pulled(5, Duration::from_millis(10)).await, Ok(()));
        let err = rooms.wait_pulled(6, Duration::from_millis(10)).await.unwrap_err();
        assert!(err.starts_with("Request 6 timed out after 0.0s in KVPoll.Bootstrapping"), "{err}");
        rooms.sweep(Duration::ZERO);
        assert!(rooms.is_empty());
    }
}
