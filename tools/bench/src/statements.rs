//! Statements and round trips per request, counted on the wire: a TCP
//! proxy between `oncepay serve` and PostgreSQL reads the frontend's
//! protocol messages (it never changes a byte). An `Execute` (extended
//! protocol) or a `Query` (simple protocol, sqlx's `BEGIN`/`COMMIT`) is one
//! statement; a `Sync` or a `Query` is one round trip, since the client
//! then waits for `ReadyForQuery`; a `Parse` is a statement prepared on a
//! connection (sqlx caches them per connection).
//!
//! A profile names where the time goes; these counts name what a request
//! costs the database whatever the machine, so a change that saves a
//! statement shows here even when the noise of a throughput run hides it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What crossed the proxy so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// `Execute` and `Query` messages.
    pub statements: u64,
    /// `Sync` and `Query` messages: each waits for the server's answer.
    pub round_trips: u64,
    /// `Parse` messages: statements prepared on a connection.
    pub parses: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, earlier: Counts) -> Counts {
        Counts {
            statements: self.statements.saturating_sub(earlier.statements),
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            parses: self.parses.saturating_sub(earlier.parses),
        }
    }
}

#[derive(Default)]
struct Shared {
    statements: AtomicU64,
    round_trips: AtomicU64,
    parses: AtomicU64,
}

/// A running counting proxy.
pub struct Counter {
    shared: Arc<Shared>,
    /// The loopback port it listens on.
    pub port: u16,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Counter {
    /// Listens on a free loopback port, forwarding to `upstream`
    /// (`host:port` of PostgreSQL). Connections must not use TLS
    /// (`sslmode=disable`): the proxy reads the messages.
    pub async fn start(upstream: String) -> std::io::Result<Counter> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let counting = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (shared, upstream) = (counting.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = relay(client, server, shared).await;
                    }
                });
            }
        });
        Ok(Counter {
            shared,
            port,
            accept,
        })
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        Counts {
            statements: self.shared.statements.load(Ordering::Relaxed),
            round_trips: self.shared.round_trips.load(Ordering::Relaxed),
            parses: self.shared.parses.load(Ordering::Relaxed),
        }
    }
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    let mut frames = Frames::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from_client.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        to_server.write_all(&buf[..n]).await?;
        let seen = frames.feed(&buf[..n]);
        shared
            .statements
            .fetch_add(seen.statements, Ordering::Relaxed);
        shared
            .round_trips
            .fetch_add(seen.round_trips, Ordering::Relaxed);
        shared.parses.fetch_add(seen.parses, Ordering::Relaxed);
    }
    let _ = to_server.shutdown().await;
    answers.abort();
    Ok(())
}

/// The frontend's message stream, split into messages as bytes arrive in
/// any chunks: first the untyped startup message (length, then body), then
/// typed ones (a byte, a length that counts itself, the body).
#[derive(Default)]
struct Frames {
    started: bool,
    pending: Vec<u8>,
}

impl Frames {
    fn feed(&mut self, bytes: &[u8]) -> Counts {
        self.pending.extend_from_slice(bytes);
        let mut counts = Counts::default();
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            let (header, kind) = if self.started {
                (5, rest.first().copied())
            } else {
                (4, None)
            };
            if rest.len() < header {
                break;
            }
            let length_at = header - 4;
            let length = u32::from_be_bytes([
                rest[length_at],
                rest[length_at + 1],
                rest[length_at + 2],
                rest[length_at + 3],
            ]) as usize;
            let total = length_at + length.max(4);
            if rest.len() < total {
                break;
            }
            match kind {
                // The startup message; an SSL or GSS request (code 80877103
                // or 80877104) would precede another startup, never here
                // under sslmode=disable.
                None => self.started = true,
                Some(b'E') => counts.statements += 1,
                Some(b'Q') => {
                    counts.statements += 1;
                    counts.round_trips += 1;
                }
                Some(b'S') => counts.round_trips += 1,
                Some(b'P') => counts.parses += 1,
                Some(_) => {}
            }
            at += total;
        }
        self.pending.drain(..at);
        counts
    }
}

/// One way of paying, measured.
struct Measured {
    /// Per payment, idle work taken out.
    per_payment: (f64, f64, f64),
    /// Statements per second while nothing is asked.
    idle_per_second: f64,
}

/// Statements and round trips per payment: a stack of its own whose
/// `oncepay serve` reaches PostgreSQL through the counting proxy, `n`
/// payments one after another (no contention, so no retries), first with
/// the sandbox's webhooks off (the command alone), then on (each payment's
/// provider webhook, its confirmation, and whatever follows it). What the
/// workers do while idle, measured for 3 s before, is taken out pro rata.
/// Returns the report's section.
pub async fn per_payment(
    pg_server: &str,
    serve_env: &[(String, String)],
    n: usize,
) -> Result<String, String> {
    let command = measure(pg_server, serve_env, n, false).await?;
    let whole = measure(pg_server, serve_env, n, true).await?;
    let (c, w) = (command.per_payment, whole.per_payment);
    let row =
        |name: &str, (s, r, p): (f64, f64, f64)| format!("| {name} | {s:.1} | {r:.1} | {p:.2} |\n");
    let mut out = format!(
        "\nStatements and round trips per payment, counted on the wire ({n} payments one after another; \
         the workers' idle work, {:.1} statements/s, taken out):\n\n\
         | per payment | statements | round trips | statements prepared |\n|---|---:|---:|---:|\n",
        whole.idle_per_second.max(command.idle_per_second)
    );
    out += &row("the command (`POST /payments`, webhooks off)", c);
    out += &row(
        "its provider webhook and what follows it",
        (w.0 - c.0, w.1 - c.1, w.2 - c.2),
    );
    out += &row("in all", w);
    Ok(out)
}

async fn measure(
    pg_server: &str,
    serve_env: &[(String, String)],
    n: usize,
    webhooks: bool,
) -> Result<Measured, String> {
    let server = reqwest::Url::parse(pg_server).map_err(|e| e.to_string())?;
    let upstream = format!(
        "{}:{}",
        server.host_str().unwrap_or("127.0.0.1"),
        server.port().unwrap_or(5432)
    );
    let counter = Counter::start(upstream).await.map_err(|e| e.to_string())?;
    let database = format!("oncepay_bench_count_{}", uuid::Uuid::new_v4().simple());
    let mut proxied = server.clone();
    proxied
        .set_port(Some(counter.port))
        .map_err(|_| "the database URL takes no port".to_string())?;
    proxied.set_path(&database);
    proxied.set_query(Some("sslmode=disable"));
    let variant = crate::stack::Variant {
        serve_db_url: Some(proxied.to_string()),
        sandbox_env: if webhooks {
            Vec::new()
        } else {
            vec![("ONCEPAY_SANDBOX_WEBHOOKS".into(), "off".into())]
        },
    };
    let stack = crate::stack::Stack::start_as(pg_server, &database, serve_env, variant).await?;
    let db = sqlx::PgPool::connect(&stack.db_url)
        .await
        .map_err(|e| e.to_string())?;
    let result = async {
        let merchant: uuid::Uuid =
            sqlx::query_scalar("SELECT id FROM merchant WHERE name = 'bench'")
                .fetch_one(&db)
                .await
                .map_err(|e| e.to_string())?;
        let orders = crate::pay::prepare_orders(&db, merchant, n + WARM_UP).await?;
        let client = reqwest::Client::new();
        let pay = |order: uuid::Uuid| {
            client
                .post(format!("{}/payments", stack.base))
                .bearer_auth(&stack.api_key)
                .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                .json(&serde_json::json!({"order_id": order, "payment_method": "tok_visa"}))
                .send()
        };
        // Warm up: every pooled connection prepares its statements once.
        for order in &orders[..WARM_UP] {
            pay(*order).await.map_err(|e| e.to_string())?;
        }
        settle(&client, &stack).await;
        let idle_from = (counter.counts(), std::time::Instant::now());
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let idle = counter.counts() - idle_from.0;
        let idle_per_second = idle.statements as f64 / idle_from.1.elapsed().as_secs_f64();
        let idle_rate = |c: Counts, secs: f64| {
            let per = secs / idle_from.1.elapsed().as_secs_f64();
            (
                c.statements as f64 - idle.statements as f64 * per,
                c.round_trips as f64 - idle.round_trips as f64 * per,
                c.parses as f64 - idle.parses as f64 * per,
            )
        };
        let (before, started) = (counter.counts(), std::time::Instant::now());
        for order in &orders[WARM_UP..] {
            let answer = pay(*order).await.map_err(|e| e.to_string())?;
            if answer.status() != reqwest::StatusCode::CREATED {
                return Err(format!("a payment answered {}", answer.status()));
            }
        }
        settle(&client, &stack).await;
        let (s, r, p) = idle_rate(counter.counts() - before, started.elapsed().as_secs_f64());
        let per = n as f64;
        Ok(Measured {
            per_payment: (s / per, r / per, p / per),
            idle_per_second,
        })
    }
    .await;
    db.close().await;
    drop(stack);
    crate::stack::drop_database(pg_server, &database).await;
    result
}

/// Payments made before counting, so that counting starts with every
/// pooled connection's statements prepared.
const WARM_UP: usize = 40;

/// Waits until the sandbox has no webhook left to send, and a little more
/// for the last one's work.
async fn settle(client: &reqwest::Client, stack: &crate::stack::Stack) {
    for _ in 0..1500 {
        let in_flight = oncepay_testkit::ledger::totals(client, &stack.sandbox)
            .await
            .map(|t| t["work_in_flight"].as_u64().unwrap_or(0))
            .unwrap_or(0);
        if in_flight == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn messages_are_counted_whatever_the_chunks() {
        let mut stream = Vec::new();
        // Startup: length, protocol 3.0, user.
        let startup = b"\x00\x03\x00\x00user\x00postgres\x00\x00";
        stream.extend_from_slice(&((startup.len() + 4) as u32).to_be_bytes());
        stream.extend_from_slice(startup);
        stream.extend(message(b'Q', b"BEGIN\x00"));
        stream.extend(message(b'P', b"\x00SELECT 1\x00\x00\x00"));
        stream.extend(message(b'D', b"S\x00"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'B', b"\x00\x00\x00\x00\x00\x00\x00\x00"));
        stream.extend(message(b'E', b"\x00\x00\x00\x00\x00"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', b"COMMIT\x00"));
        let expected = Counts {
            statements: 3,
            round_trips: 4,
            parses: 1,
        };
        for chunk in [1, 2, 3, 7, stream.len()] {
            let mut frames = Frames::default();
            let mut counts = Counts::default();
            for piece in stream.chunks(chunk) {
                let seen = frames.feed(piece);
                counts.statements += seen.statements;
                counts.round_trips += seen.round_trips;
                counts.parses += seen.parses;
            }
            assert_eq!(counts, expected, "in chunks of {chunk}");
            assert!(frames.pending.is_empty());
        }
    }

    /// Through the proxy to the real PostgreSQL: the connection works
    /// (bytes pass unchanged) and a transaction of one prepared statement
    /// is counted as what it is.
    #[tokio::test]
    async fn a_real_connection_passes_and_is_counted() {
        let server = std::env::var("TEST_DATABASE_SERVER")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let url = reqwest::Url::parse(&server).expect("a URL");
        let counter = Counter::start(format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5432)
        ))
        .await
        .expect("the proxy starts");
        let mut proxied = url.clone();
        proxied.set_port(Some(counter.port)).expect("a port");
        proxied.set_path("postgres");
        proxied.set_query(Some("sslmode=disable"));
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect(proxied.as_str())
            .await
            .expect("connects through the proxy");
        let before = counter.counts();
        let mut tx = db.begin().await.expect("begin");
        let one: i32 = sqlx::query_scalar("SELECT $1::int")
            .bind(1)
            .fetch_one(&mut *tx)
            .await
            .expect("select");
        tx.commit().await.expect("commit");
        assert_eq!(one, 1);
        let seen = counter.counts() - before;
        // BEGIN and COMMIT (simple queries) and one prepared statement.
        assert_eq!(seen.statements, 3, "{seen:?}");
        assert_eq!(seen.parses, 1, "{seen:?}");
        assert!(seen.round_trips >= 3, "{seen:?}");
    }
}
