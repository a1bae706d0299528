//! The KV transfer between a prefill rank and a decode rank over the rank's registered TCP port:
//! the decode asks for a room's bytes, the prefill rank streams them once the room is computed,
//! followed by a checksum keyed by the room and the sender's row, which the decode verifies.
//!
//! Frame (little endian): request `magic u32, room u64, tokens u64, bytes u64, decode rank u32`;
//! answer `status u8`, then `bytes` payload and a `u64` trailer (status 0), or a `u32` length and
//! an error text.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use super::rooms::Rooms;

const MAGIC: u32 = 0x5044_4b56; // "PDKV"
/// Payload chunk: both sides checksum the same chunk boundaries (a multiple of 8 bytes).
const CHUNK: usize = 256 << 10;
const REQUEST_LEN: usize = 32;
/// Idle pooled connections kept per prefill rank.
const POOL_PER_ENDPOINT: usize = 64;

#[derive(Debug, Error)]
pub enum TransferError {
    #[error("connect to prefill rank {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("connection to prefill rank {addr} lost after {got} of {want} bytes: {source}")]
    Lost { addr: String, got: u64, want: u64, source: std::io::Error },
    #[error("prefill rank {addr} refused the transfer: {message}")]
    Refused { addr: String, message: String },
    #[error("KV checksum mismatch from prefill rank {addr}: got {got:#018x}, expected {want:#018x}")]
    Checksum { addr: String, got: u64, want: u64 },
}

/// A prefill row as the bootstrap table keys it.
pub type Row = (i64, i64, i64, i64);

/// Mixes the room and the sender's row into the trailer, so KV from the wrong rank or room fails.
pub fn seal(room: u64, row: Row) -> u64 {
    let mut h = room ^ 0x9e37_79b9_7f4a_7c15;
    for v in [row.0, row.1, row.2, row.3] {
        h = (h ^ v as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    }
    h
}

/// A running checksum over 8-byte words (two sums, so order matters); a short last chunk is
/// zero-padded.
#[derive(Default, Clone, Copy)]
pub struct Checksum {
    a: u64,
    b: u64,
}

impl Checksum {
    pub fn update(&mut self, chunk: &[u8]) {
        let mut words = chunk.chunks_exact(8);
        for w in &mut words {
            self.a = self.a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap_or_default()));
            self.b = self.b.wrapping_add(self.a);
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.a = self.a.wrapping_add(u64::from_le_bytes(last));
            self.b = self.b.wrapping_add(self.a);
        }
    }
    pub fn value(&self) -> u64 {
        self.a ^ self.b.rotate_left(32)
    }
    /// The checksum of this run followed by `next`, a run of `next_words` words.
    fn then(self, next: Checksum, next_words: u64) -> Checksum {
        Checksum { a: self.a.wrapping_add(next.a), b: self.b.wrapping_add(next_words.wrapping_mul(self.a)).wrapping_add(next.b) }
    }
}

/// A rank's pattern with the checksum of every word prefix, so a sender checksums what it sends
/// without reading it again (the decode still reads and checks every byte).
struct Pattern {
    bytes: Vec<u8>,
    prefix: Vec<Checksum>,
}

impl Pattern {
    fn new(row: Row) -> Self {
        let bytes = pattern(row);
        let mut prefix = Vec::with_capacity(bytes.len() / 8 + 1);
        let mut sum = Checksum::default();
        prefix.push(sum);
        for w in bytes.chunks_exact(8) {
            sum.update(w);
            prefix.push(sum);
        }
        Self { bytes, prefix }
    }
    /// Checksum of the first `len` bytes, as `Checksum::update` would compute it.
    fn sum_of(&self, len: usize) -> Checksum {
        let mut c = self.prefix[len / 8];
        if !len.is_multiple_of(8) {
            c.update(&self.bytes[len / 8 * 8..len]);
        }
        c
    }
}

/// The bytes a rank "holds": a pattern derived from its row, repeated.
fn pattern(row: Row) -> Vec<u8> {
    let mut x = seal(0, row) | 1;
    (0..CHUNK / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// Faults a prefill rank injects into its transfers.
#[derive(Clone, Copy, Debug, Default)]
pub struct SenderFaults {
    /// Exit the process half-way through this transfer of the instance (1-based; 0: never).
    pub die_at_transfer: u64,
    /// Pace each transfer to this many bytes per second (0: as fast as the socket goes).
    pub bytes_per_s: f64,
    /// Accept pulls but never answer (the decode times out waiting for input).
    pub stall: bool,
}

/// A prefill rank's side: serves pulls for its row from the instance's rooms.
pub struct RankServer {
    pub row: Row,
    pub rooms: Arc<Rooms>,
    pub faults: SenderFaults,
    /// Transfers started by every rank of this instance (for `die_at_transfer`).
    pub started: Arc<AtomicU64>,
    pub sent_bytes: Arc<AtomicU64>,
    /// How long a pull waits for the room to be computed; `None` on a node that does not run the
    /// API (node k > 0 of a multi-node prefill computes in lockstep with node 0: no wait).
    pub wait: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ask {
    room: u64,
    tokens: u64,
    bytes: u64,
    decode_rank: u32,
}

fn decode_ask(buf: &[u8; REQUEST_LEN]) -> Option<Ask> {
    let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap_or_default());
    let magic = u32::from_le_bytes(buf[0..4].try_into().unwrap_or_default());
    (magic == MAGIC).then(|| Ask {
        room: u64_at(4),
        tokens: u64_at(12),
        bytes: u64_at(20),
        decode_rank: u32::from_le_bytes(buf[28..32].try_into().unwrap_or_default()),
    })
}

fn encode_ask(a: &Ask) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..12].copy_from_slice(&a.room.to_le_bytes());
    b[12..20].copy_from_slice(&a.tokens.to_le_bytes());
    b[20..28].copy_from_slice(&a.bytes.to_le_bytes());
    b[28..32].copy_from_slice(&a.decode_rank.to_le_bytes());
    b
}

async fn refuse(stream: &mut TcpStream, message: &str) -> std::io::Result<()> {
    let mut out = vec![1u8];
    out.extend_from_slice(&(message.len() as u32).to_le_bytes());
    out.extend_from_slice(message.as_bytes());
    stream.write_all(&out).await
}

impl RankServer {
    /// Accepts decode connections until the listener fails; each connection serves many pulls.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let pattern = Arc::new(Pattern::new(self.row));
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let (me, pattern) = (self.clone(), pattern.clone());
            tokio::spawn(async move {
                if let Err(e) = me.connection(stream, &pattern).await {
                    debug!(error = %e, "KV connection closed");
                }
            });
        }
    }

    async fn connection(&self, mut stream: TcpStream, pattern: &Pattern) -> std::io::Result<()> {
        let mut buf = [0u8; REQUEST_LEN];
        loop {
            stream.read_exact(&mut buf).await?;
            let Some(ask) = decode_ask(&buf) else { return refuse(&mut stream, "bad KV request frame").await };
            if self.faults.stall {
                futures::future::pending::<()>().await;
            }
            let ready = match self.wait {
                Some(wait) => self.rooms.wait_ready(ask.room, wait).await,
                None => Ok(ask.tokens),
            };
            let tokens = match ready {
                Ok(t) => t,
                Err(e) => return refuse(&mut stream, &e).await,
            };
            if tokens != ask.tokens {
                let msg = format!("room {} holds {tokens} tokens, the decode expects {}", ask.room, ask.tokens);
                return refuse(&mut stream, &msg).await;
            }
            self.send(&mut stream, &ask, pattern).await?;
            self.rooms.pulled(ask.room);
        }
    }

    async fn send(&self, stream: &mut TcpStream, ask: &Ask, pattern: &Pattern) -> std::io::Result<()> {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let die_at = (self.faults.die_at_transfer == n).then_some(ask.bytes / 2);
        stream.write_all(&[0u8]).await?;
        let (mut sum, mut left, start) = (Checksum::default(), ask.bytes, Instant::now());
        while left > 0 {
            let len = left.min(CHUNK as u64) as usize;
            if die_at.is_some_and(|half| ask.bytes - left >= half) {
                warn!(room = ask.room, decode_rank = ask.decode_rank, "fault injection: the prefill dies mid-transfer");
                let _ = stream.flush().await;
                std::process::exit(137);
            }
            sum = sum.then(pattern.sum_of(len), len.div_ceil(8) as u64);
            stream.write_all(&pattern.bytes[..len]).await?;
            left -= len as u64;
            self.sent_bytes.fetch_add(len as u64, Ordering::Relaxed);
            if self.faults.bytes_per_s > 0.0 {
                let due = start + Duration::from_secs_f64((ask.bytes - left) as f64 / self.faults.bytes_per_s);
                tokio::time::sleep_until(due.into()).await;
            }
        }
        stream.write_all(&(sum.value() ^ seal(ask.room, self.row)).to_le_bytes()).await
    }
}

/// The decode's side: pooled connections to prefill ranks.
#[derive(Default)]
pub struct Puller {
    idle: Mutex<HashMap<String, Vec<TcpStream>>>,
}

/// One pull to make: where, which row, for which room and decode rank.
#[derive(Clone, Debug)]
pub struct PullSpec {
    pub addr: String,
    pub row: Row,
    pub room: u64,
    pub tokens: u64,
    pub bytes: u64,
    pub decode_rank: u32,
}

impl Puller {
    async fn connection(&self, addr: &str) -> Result<TcpStream, TransferError> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).get_mut(addr).and_then(Vec::pop);
        if let Some(s) = pooled {
            return Ok(s);
        }
        let s = TcpStream::connect(addr).await.map_err(|source| TransferError::Connect { addr: addr.to_owned(), source })?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }

    fn give_back(&self, addr: &str, s: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let v = idle.entry(addr.to_owned()).or_default();
        if v.len() < POOL_PER_ENDPOINT {
            v.push(s);
        }
    }

    /// Drops pooled connections to `addr` (after a failure: the rank may be gone).
    pub fn forget(&self, addr: &str) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).remove(addr);
    }

    /// Pulls and verifies one row's KV; returns the bytes received.
    pub async fn pull(&self, spec: &PullSpec) -> Result<u64, TransferError> {
        let mut s = self.connection(&spec.addr).await?;
        let ask = Ask { room: spec.room, tokens: spec.tokens, bytes: spec.bytes, decode_rank: spec.decode_rank };
        let lost = |got: u64, source: std::io::Error| TransferError::Lost { addr: spec.addr.clone(), got, want: spec.bytes, source };
        s.write_all(&encode_ask(&ask)).await.map_err(|e| lost(0, e))?;
        let status = s.read_u8().await.map_err(|e| lost(0, e))?;
        if status != 0 {
            let len = s.read_u32_le().await.map_err(|e| lost(0, e))? as usize;
            let mut msg = vec![0u8; len.min(64 << 10)];
            s.read_exact(&mut msg).await.map_err(|e| lost(0, e))?;
            return Err(TransferError::Refused { addr: spec.addr.clone(), message: String::from_utf8_lossy(&msg).into_owned() });
        }
        let (mut sum, mut got, mut buf) = (Checksum::default(), 0u64, vec![0u8; CHUNK]);
        while got < spec.bytes {
            let len = (spec.bytes - got).min(CHUNK as u64) as usize;
            s.read_exact(&mut buf[..len]).await.map_err(|e| lost(got, e))?;
            sum.update(&buf[..len]);
            got += len as u64;
        }
        let trailer = s.read_u64_le().await.map_err(|e| lost(got, e))?;
        let want = sum.value() ^ seal(spec.room, spec.row);
        if trailer != want {
            return Err(TransferError::Checksum { addr: spec.addr.clone(), got: trailer, want });
        }
        self.give_back(&spec.addr, s);
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_checksums_see_order() {
        let a = Ask { room: 7, tokens: 9, bytes: 1 << 40, decode_rank: 3 };
        assert_eq!(decode_ask(&encode_ask(&a)), Some(a));
        let (mut x, mut y) = (Checksum::default(), Checksum::default());
        x.update(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        y.update(&[9, 2, 3, 4, 5, 6, 7, 8, 1]);
        assert_ne!(x.value(), y.value());
        assert_ne!(seal(1, (0, 0, 0, 0)), seal(1, (0, 0, 1, 0)));
        assert_ne!(seal(1, (0, 0, 0, 0)), seal(2, (0, 0, 0, 0)));
        // What a sender derives from prefix sums equals reading the bytes, chunk by chunk.
        let p = Pattern::new((0, 0, 3, 1));
        let (mut derived, mut read) = (Checksum::default(), Checksum::default());
        for len in [CHUNK, CHUNK, 1001] {
            derived = derived.then(p.sum_of(len), len.div_ceil(8) as u64);
            read.update(&p.bytes[..len]);
        }
        assert_eq!(derived.value(), read.value());
    }
}
