//! Helpers shared by the server backends' harnesses.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A database name no other test (or earlier run) uses: `orderly_t_<pid>_<n>_<nanos>`.
/// CI drops leftovers of crashed runs by the `orderly_t_` prefix.
pub fn unique_db_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "orderly_t_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The server URL from `var`, or `default`. A server that cannot be reached fails the
/// test: these suites never skip.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// The address of a server given by host and port (`localhost` as loopback).
pub fn socket_addr(host: &str, port: u16) -> std::net::SocketAddr {
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{port}").parse().unwrap()
}

/// Polls `probe` until it returns true, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if probe().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Where [`Proxy`] cuts a connection, once.
#[derive(Debug, Clone, Copy)]
pub enum Cut {
    /// Forward the request holding these bytes (e.g. `COMMIT`), then drop the server's
    /// reply to it and close both sides: the server did the work, the client never hears.
    ReplyTo(&'static [u8]),
    /// Drop the first server reply holding these bytes (e.g. PostgreSQL's `INSERT 0 1`
    /// command tag, sent with the implicit commit's `ReadyForQuery`) and close both sides.
    Reply(&'static [u8]),
    /// Drop the first client request holding these bytes before the server sees it, and
    /// close both sides: the write never happened, and the client never hears.
    Request(&'static [u8]),
    /// Forward the first client request holding these bytes, then close both sides at
    /// once: the server goes on with the statement it received (and may commit it later),
    /// the client hears only that its connection is gone.
    Forward(&'static [u8]),
}

/// A TCP proxy on loopback in front of a real server that cuts one connection at a
/// chosen point of the conversation, so a test knows the server committed a write whose
/// reply the client never got.
pub struct Proxy {
    pub port: u16,
    shared: std::sync::Arc<ProxyShared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyShared {
    cuts: AtomicU32,
    /// Once cut, refuse every new connection (the client cannot read anything back).
    refuse_after_cut: std::sync::atomic::AtomicBool,
    /// Frozen: nothing is forwarded either way and new connections are accepted but
    /// never answered, as from a server that stopped (a dead node, a cut network).
    frozen: std::sync::atomic::AtomicBool,
    /// Connections accepted so far.
    accepted: AtomicU32,
}

impl Proxy {
    pub async fn start(server: std::net::SocketAddr, cut: Cut) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = std::sync::Arc::new(ProxyShared::default());
        let task = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    if shared.refuse_after_cut.load(Ordering::SeqCst)
                        && shared.cuts.load(Ordering::SeqCst) > 0
                    {
                        continue; // dropped: the client's connect fails
                    }
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        shared.thawed().await;
                        if let Ok(upstream) = tokio::net::TcpStream::connect(server).await {
                            relay(client, upstream, cut, &shared).await;
                        }
                    });
                }
            }
        });
        Proxy { port, shared, task }
    }

    /// After the cut, refuse new connections too.
    pub fn refuse_after_cut(&self) {
        self.shared.refuse_after_cut.store(true, Ordering::SeqCst);
    }

    /// Stops forwarding anything, and answering new connections, until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    /// Forwards again.
    pub fn thaw(&self) {
        self.shared.frozen.store(false, Ordering::SeqCst);
    }

    /// How many connections clients opened through the proxy.
    pub fn accepted(&self) -> u32 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// How many connections were cut (at most one).
    pub fn cuts(&self) -> u32 {
        self.shared.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ProxyShared {
    async fn thawed(&self) {
        while self.frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

fn holds(chunk: &[u8], pattern: &[u8]) -> bool {
    chunk.windows(pattern.len()).any(|w| w == pattern)
}

/// Forwards both ways until either side closes or the cut; dropping both streams closes
/// both sockets.
async fn relay(
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    cut: Cut,
    shared: &ProxyShared,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = upstream.into_split();
    let armed = std::sync::atomic::AtomicBool::new(false);
    let fire = || {
        shared
            .cuts
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    };
    let requests = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            shared.thawed().await;
            if let Cut::ReplyTo(pattern) = cut
                && holds(&buf[..n], pattern)
                && shared.cuts.load(Ordering::SeqCst) == 0
            {
                armed.store(true, Ordering::SeqCst);
            }
            if let Cut::Request(pattern) = cut
                && holds(&buf[..n], pattern)
                && fire()
            {
                return;
            }
            if let Cut::Forward(pattern) = cut
                && holds(&buf[..n], pattern)
                && shared.cuts.load(Ordering::SeqCst) == 0
            {
                let _ = server_tx.write_all(&buf[..n]).await;
                let _ = server_tx.flush().await;
                if fire() {
                    return;
                }
                continue;
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let replies = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            shared.thawed().await;
            let cut_here = match cut {
                Cut::ReplyTo(_) => armed.load(Ordering::SeqCst),
                Cut::Reply(pattern) => holds(&buf[..n], pattern),
                Cut::Request(_) | Cut::Forward(_) => false,
            };
            if cut_here && fire() {
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}

/// `sql` with orderly's tables, written as MariaDB and SQLite name them in the default
/// namespace (`orderly_outbox`), named as PostgreSQL keeps them, in the schema `orderly`
/// (`orderly.outbox`).
#[allow(dead_code)]
pub fn in_schema(sql: &str) -> String {
    const TABLES: [&str; 9] = [
        "transitions",
        "idempotency_records",
        "one_time_tokens",
        "flow_steps",
        "flows",
        "outbox",
        "inbox",
        "timers",
        "audit",
    ];
    let mut out = sql.to_owned();
    for table in TABLES {
        out = out.replace(&format!("orderly_{table}"), &format!("orderly.{table}"));
    }
    out
}
