//! Reading a request body, bounded in size, in time and in how many slow
//! bodies one client may hold open at once. Without a deadline, a client
//! that declares `Content-Length: 1000` and sends six bytes holds a
//! connection (and, once authenticated, nothing else) for ever; thousands
//! of them would exhaust the server. The parser already answers a stalled
//! request head with `408` after `ONCEPAY_HEADER_TIMEOUT`; this is the same
//! rule for the body.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest};

use crate::problem::{Problem, ProblemCode};

/// The limits of every body read (`ONCEPAY_MAX_BODY_BYTES`,
/// `ONCEPAY_BODY_TIMEOUT`, `ONCEPAY_SLOW_BODIES_PER_CLIENT`).
pub struct BodyLimits {
    /// Largest accepted body.
    pub max_bytes: usize,
    /// How long a body may take to arrive, from the first wait for it.
    pub timeout: Duration,
    /// Bodies one client address may be slow to send at once.
    pub slow_per_client: usize,
    slow: Mutex<HashMap<IpAddr, usize>>,
}

impl BodyLimits {
    /// Limits with these bounds.
    pub fn new(max_bytes: usize, timeout: Duration, slow_per_client: usize) -> BodyLimits {
        BodyLimits {
            max_bytes,
            timeout,
            slow_per_client,
            slow: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one more slow body of `ip`, or refuses it past the bound.
    fn enter(&self, ip: Option<IpAddr>) -> Result<SlowBody<'_>, Problem> {
        let Some(ip) = ip else {
            return Ok(SlowBody { limits: self, ip });
        };
        let mut slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        let count = slow.entry(ip).or_insert(0);
        if *count >= self.slow_per_client {
            return Err(Problem::new(
                ProblemCode::RateLimited,
                format!(
                    "this address already has {} request bodies still arriving; finish them first",
                    self.slow_per_client
                ),
            )
            .retry_after(1));
        }
        *count += 1;
        Ok(SlowBody {
            limits: self,
            ip: Some(ip),
        })
    }
}

/// A slow body being waited for; uncounted when dropped.
struct SlowBody<'a> {
    limits: &'a BodyLimits,
    ip: Option<IpAddr>,
}

impl Drop for SlowBody<'_> {
    fn drop(&mut self) {
        let Some(ip) = self.ip else { return };
        let mut slow = self.limits.slow.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = slow.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                slow.remove(&ip);
            }
        }
    }
}

/// Reads the body: `413` as soon as the declared length or the bytes read
/// pass the size limit; `408` if it has not arrived within the timeout;
/// `429` if the client already has as many slow bodies open as allowed. A
/// body that arrived with its head (nearly every one) is never counted as
/// slow.
pub async fn read(
    limits: &BodyLimits,
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<web::Bytes, Problem> {
    let limit = limits.max_bytes;
    let too_large = || {
        Problem::new(
            ProblemCode::PayloadTooLarge,
            format!("the body must be at most {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    // Nearly every body arrives with its head: read it without arming a
    // timer. Only a body still to come is counted as slow and given the
    // deadline, from this first wait.
    let mut reading = std::pin::pin!(payload.to_bytes_limited(limit));
    let first = std::future::poll_fn(|cx| Poll::Ready(reading.as_mut().poll(cx))).await;
    let read = match first {
        Poll::Ready(read) => Ok(read),
        Poll::Pending => {
            let _slow = limits.enter(req.peer_addr().map(|a| a.ip()))?;
            tokio::time::timeout(limits.timeout, reading).await
        }
    };
    // The outer error is the limit (a chunked body carries no length to
    // check up front); the inner one is a body that could not be read.
    match read {
        Ok(Ok(Ok(bytes))) => Ok(bytes),
        Ok(Ok(Err(_))) => Err(Problem::new(
            ProblemCode::MalformedJson,
            "the body could not be read",
        )),
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err(Problem::new(
            ProblemCode::RequestTimeout,
            format!(
                "the body did not arrive within {} ms; send it whole, promptly",
                limits.timeout.as_millis()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_bodies_are_bounded_per_address_and_released() {
        let limits = BodyLimits::new(1024, Duration::from_secs(1), 2);
        let a: Option<IpAddr> = "192.0.2.1".parse().ok();
        let b: Option<IpAddr> = "192.0.2.2".parse().ok();
        let first = limits.enter(a).expect("first");
        let _second = limits.enter(a).expect("second");
        let refused = limits.enter(a).err().map(|p| p.status);
        assert_eq!(refused, Some(429));
        assert!(limits.enter(b).is_ok(), "another address is not affected");
        drop(first);
        assert!(limits.enter(a).is_ok(), "a finished body frees its place");
    }
}
