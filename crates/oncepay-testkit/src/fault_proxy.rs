//! A fault proxy between oncepay and its payment provider, for the faults
//! the sandbox cannot make itself: a status read refused with `403` or
//! `408`, redirected, or answered with garbage; a charge answered `409`; a
//! provider that is down for a spell; refunds unreachable; and a provider
//! that takes the money but answers with a decline. It speaks plain HTTP on
//! loopback and forwards everything else unchanged.
//!
//! Used by the fault harness (`make chaos`) and by the API tests, so both
//! exercise the same faults.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::http::{Method, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};

/// Which provider calls a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET /v1/charges…` and `GET /v1/refunds…`: the safe status reads.
    StatusRead,
    /// `POST /v1/charges`.
    Charge,
    /// `POST /v1/charges/{id}/cancel`: giving up on a charge whose
    /// customer never authenticated.
    Cancel,
    /// `POST /v1/refunds`.
    Refund,
    /// Anything else (health, ledger).
    Other,
}

impl Route {
    fn of(method: &Method, path: &str) -> Route {
        let charges = path.starts_with("/v1/charges");
        let refunds = path.starts_with("/v1/refunds");
        match *method {
            Method::GET if charges || refunds => Route::StatusRead,
            Method::POST if charges && path.ends_with("/cancel") => Route::Cancel,
            Method::POST if charges => Route::Charge,
            Method::POST if refunds => Route::Refund,
            _ => Route::Other,
        }
    }
}

/// What the proxy does with a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Forward it and relay the answer.
    Pass,
    /// Answer this without forwarding (a WAF, a rotated credential, a
    /// redirecting gateway, a provider's own `409`).
    Answer {
        /// HTTP status.
        status: u16,
        /// Body, sent as `application/json`.
        body: String,
    },
    /// Answer `200` with a body that is not the provider's JSON.
    Garbage,
    /// Close the connection without forwarding or answering: the provider
    /// is down or unreachable.
    Down,
    /// Forward (so the provider acts), then answer this instead of what
    /// the provider said: a provider whose answer lies.
    ForwardThenAnswer {
        /// HTTP status.
        status: u16,
        /// Body, sent as `application/json`.
        body: String,
    },
    /// Hold the call until [`FaultProxy::release`], then forward it: a
    /// call in flight while something else happens at the provider.
    Hold,
}

impl Fault {
    /// `status` with `{"code": code}`.
    pub fn answer(status: u16, code: &str) -> Fault {
        Fault::Answer {
            status,
            body: format!(r#"{{"code":"{code}","detail":"injected by the fault proxy"}}"#),
        }
    }
}

#[derive(Default)]
struct Rules {
    faults: HashMap<Route, Fault>,
    /// Calls that met a fault, by route.
    faulted: HashMap<Route, u64>,
    /// Calls forwarded, by route.
    forwarded: HashMap<Route, u64>,
    /// Calls held now.
    held: u64,
}

struct Shared {
    rules: Mutex<Rules>,
    upstream: String,
    http: reqwest::Client,
    release: tokio::sync::Notify,
}

impl Shared {
    fn rules(&self) -> MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running fault proxy.
#[derive(Clone)]
pub struct FaultProxy {
    shared: Arc<Shared>,
    url: String,
}

/// A body that fails at once, so the connection closes with no answer.
pub struct Dropped;

impl MessageBody for Dropped {
    type Error = std::io::Error;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::other("fault proxy: down"))))
    }
}

fn json(status: u16, body: String) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
        .content_type("application/json")
        .body(body)
}

async fn forward(shared: &Shared, req: &HttpRequest, body: Bytes) -> Result<(u16, Bytes), String> {
    let headers = ["content-type", "idempotency-key"];
    crate::loopback_http::forward(&shared.http, &shared.upstream, req, body, &headers).await
}

async fn handle(shared: web::Data<Shared>, req: HttpRequest, body: Bytes) -> HttpResponse {
    let route = Route::of(req.method(), req.path());
    let fault = {
        let mut rules = shared.rules();
        let fault = rules.faults.get(&route).cloned().unwrap_or(Fault::Pass);
        let counter = if fault == Fault::Pass {
            &mut rules.forwarded
        } else {
            &mut rules.faulted
        };
        *counter.entry(route).or_insert(0) += 1;
        fault
    };
    match fault {
        Fault::Answer { status, body } => json(status, body),
        Fault::Garbage => HttpResponse::Ok()
            .content_type("text/html")
            .body("<html><body>Service temporarily rerouted</body></html>"),
        Fault::Down => HttpResponse::Ok()
            .content_type("application/json")
            .body(Dropped),
        Fault::ForwardThenAnswer { status, body: lie } => {
            let _ = forward(&shared, &req, body).await;
            json(status, lie)
        }
        Fault::Hold | Fault::Pass => {
            if fault == Fault::Hold {
                // Registered before it is counted, so a release that
                // follows the count is never missed.
                let released = shared.release.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                shared.rules().held += 1;
                released.await;
                shared.rules().held -= 1;
            }
            relay(forward(&shared, &req, body).await)
        }
    }
}

fn relay(forwarded: Result<(u16, Bytes), String>) -> HttpResponse {
    match forwarded {
        Ok((status, bytes)) => {
            HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
                .content_type("application/json")
                .body(bytes)
        }
        // The upstream itself dropped the answer: drop ours too.
        Err(_) => HttpResponse::Ok()
            .content_type("application/json")
            .body(Dropped),
    }
}

impl FaultProxy {
    /// Lets every held call go on to the provider.
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }

    /// How many calls are held now.
    pub fn held(&self) -> u64 {
        self.shared.rules().held
    }

    /// Starts a proxy on a free loopback port in front of `upstream`
    /// (`http://127.0.0.1:PORT`), passing everything until told otherwise.
    /// The server runs on the current tokio runtime.
    pub fn start(upstream: &str) -> std::io::Result<FaultProxy> {
        let shared = Arc::new(Shared {
            rules: Mutex::new(Rules::default()),
            upstream: upstream.trim_end_matches('/').to_string(),
            release: tokio::sync::Notify::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(std::io::Error::other)?,
        });
        let url = format!(
            "http://{}",
            crate::loopback_http::serve(shared.clone(), handle)?
        );
        Ok(FaultProxy { shared, url })
    }

    /// The proxy's base URL, to use as `ONCEPAY_PROVIDER_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Applies `fault` to every later call on `route`.
    pub fn set(&self, route: Route, fault: Fault) {
        self.shared.rules().faults.insert(route, fault);
    }

    /// Applies `fault` to `routes` for `duration`, then passes them again
    /// (unless another fault was set on a route meanwhile).
    pub fn spell(&self, routes: &[Route], fault: Fault, duration: Duration) {
        for route in routes {
            self.set(*route, fault.clone());
        }
        let (proxy, routes) = (self.clone(), routes.to_vec());
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            let mut rules = proxy.shared.rules();
            for route in routes {
                if rules.faults.get(&route) == Some(&fault) {
                    rules.faults.remove(&route);
                }
            }
        });
    }

    /// Passes every call again.
    pub fn heal(&self) {
        self.shared.rules().faults.clear();
    }

    /// How many calls on `route` met a fault so far.
    pub fn faulted(&self, route: Route) -> u64 {
        self.shared
            .rules()
            .faulted
            .get(&route)
            .copied()
            .unwrap_or(0)
    }

    /// How many calls on `route` were forwarded so far.
    pub fn forwarded(&self, route: Route) -> u64 {
        self.shared
            .rules()
            .forwarded
            .get(&route)
            .copied()
            .unwrap_or(0)
    }
}
