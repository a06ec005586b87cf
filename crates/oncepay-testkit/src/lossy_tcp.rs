//! A TCP proxy between the chaos clients and one `oncepay serve` process
//! that, for a share of connections, relays the request and then closes the
//! connection as soon as the answer starts, instead of relaying it: the
//! request reached oncepay and committed, the client never hears back. The
//! clients open a connection per request, so the share is per request.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A running lossy proxy.
pub struct LossyTcp {
    /// `http://127.0.0.1:PORT` for clients.
    pub url: String,
    lost: Arc<AtomicU64>,
    per_mille: Arc<AtomicU32>,
}

impl LossyTcp {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`,
    /// losing the answers of `per_mille` of every thousand connections.
    pub async fn start(upstream: u16, per_mille: u32) -> std::io::Result<LossyTcp> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let lost = Arc::new(AtomicU64::new(0));
        let rate = Arc::new(AtomicU32::new(per_mille));
        let (lost_c, rate_c) = (lost.clone(), rate.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let lose = fastrand::u32(0..1000) < rate_c.load(Ordering::Relaxed);
                let lost = lost_c.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return; // the process is down: the client sees a refused/closed connection
                    };
                    if lose {
                        if lose_answer(client, server).await {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        let (mut client, mut server) = (client, server);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Ok(LossyTcp {
            url,
            lost,
            per_mille: rate,
        })
    }

    /// Answers lost so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Stops losing answers (the soak is over).
    pub fn stop_losing(&self) {
        self.per_mille.store(0, Ordering::Relaxed);
    }
}

/// Relays the request, waits for the first byte of the answer, then drops
/// both connections. True if an answer was there to lose.
async fn lose_answer(client: TcpStream, server: TcpStream) -> bool {
    let (mut client_read, _client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut first = [0u8; 1];
    let answered = matches!(
        tokio::time::timeout(Duration::from_secs(30), server_read.read(&mut first)).await,
        Ok(Ok(n)) if n > 0
    );
    upstream.abort();
    answered
}
