//! A merchant's webhook receiver, for the tests and the fault harness: a
//! real HTTP server on a loopback port that records every delivery it gets
//! (the three Standard Webhooks headers and the raw body) and answers as
//! told: accept, fail the first N deliveries of each event, or `410 Gone`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// `200` to everything.
    Accept,
    /// `500` to the first N deliveries of each `webhook-id`, then `200`.
    FailFirst(u32),
    /// `500` to a delivery with this chance (0 to 1), `200` otherwise.
    FailRandomly(f64),
    /// `410 Gone` to everything.
    Gone,
    /// Hold every request a minute before answering `200` (a receiver that
    /// hangs, so the sender is caught mid-delivery).
    Stall,
}

/// One delivery as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `webhook-id`.
    pub id: String,
    /// `webhook-timestamp`.
    pub timestamp: String,
    /// `webhook-signature`.
    pub signature: String,
    /// The raw body.
    pub body: Bytes,
    /// What the receiver answered (0: it held the request instead).
    pub answered: u16,
}

#[derive(Default)]
struct Books {
    received: Vec<Received>,
    seen: HashMap<String, u32>,
}

struct Shared {
    policy: Mutex<Policy>,
    books: Mutex<Books>,
}

impl Shared {
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running receiver.
#[derive(Clone)]
pub struct Receiver {
    shared: Arc<Shared>,
    url: String,
}

async fn handle(shared: web::Data<Shared>, req: HttpRequest, body: Bytes) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let policy = *shared.policy.lock().unwrap_or_else(|p| p.into_inner());
    let id = header("webhook-id");
    let answered = {
        let mut books = shared.books();
        let seen = books.seen.entry(id.clone()).or_insert(0);
        *seen += 1;
        let seen = *seen;
        let answered = match policy {
            Policy::Accept => 200,
            Policy::FailFirst(n) if seen <= n => 500,
            Policy::FailFirst(_) => 200,
            Policy::FailRandomly(p) if fastrand::f64() < p => 500,
            Policy::FailRandomly(_) => 200,
            Policy::Gone => 410,
            // Not an answer the sender waits for: recorded as none.
            Policy::Stall => 0,
        };
        books.received.push(Received {
            id,
            timestamp: header("webhook-timestamp"),
            signature: header("webhook-signature"),
            body,
            answered,
        });
        answered
    };
    if policy == Policy::Stall {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    HttpResponse::build(
        actix_web::http::StatusCode::from_u16(answered.max(200))
            .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR),
    )
    .finish()
}

impl Receiver {
    /// Starts a receiver on a free loopback port, on the current tokio runtime.
    pub fn start(policy: Policy) -> std::io::Result<Receiver> {
        let shared = Arc::new(Shared {
            policy: Mutex::new(policy),
            books: Mutex::new(Books::default()),
        });
        let addr = crate::loopback_http::serve(shared.clone(), handle)?;
        let url = format!("http://{addr}/hooks");
        Ok(Receiver { shared, url })
    }

    /// The URL to register as an endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Answers later deliveries by `policy`.
    pub fn set_policy(&self, policy: Policy) {
        *self.shared.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    /// Every delivery so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.books().received.clone()
    }

    /// The deliveries answered `2xx`, in arrival order.
    pub fn accepted(&self) -> Vec<Received> {
        self.shared
            .books()
            .received
            .iter()
            .filter(|r| (200..300).contains(&r.answered))
            .cloned()
            .collect()
    }
}
