//! One middleware for what every request needs: an `X-Request-Id` (taken
//! from the client when sane, generated otherwise) echoed on the response
//! and carried by a tracing span onto every log line of the request, the
//! request metrics, and one access log line. Headers and bodies are never
//! logged, so no API key, card token or signature reaches the logs.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::web;
use tracing::Instrument;

use super::AppState;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A client's request id is kept if it is 1–128 visible ASCII characters.
fn client_request_id(req: &ServiceRequest) -> Option<String> {
    let value = req.headers().get(&REQUEST_ID)?.to_str().ok()?;
    let sane = !value.is_empty()
        && value.len() <= 128
        && value.bytes().all(|b| (0x21..=0x7e).contains(&b));
    sane.then(|| value.to_string())
}

/// The `method` label: the methods HTTP defines, and `other` for anything
/// a client invents, so a label cannot grow without bound.
fn method_label(method: &actix_web::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "TRACE" => "TRACE",
        "CONNECT" => "CONNECT",
        _ => "other",
    }
}

/// `400 invalid_field` naming the query parameter whose name or value
/// decodes to U+0000, which no endpoint accepts and PostgreSQL cannot
/// store. A raw NUL cannot reach here (the HTTP parser refuses it), so
/// `%00` is the only way to send one.
///
/// `field` is the parameter's name as decoded, the name the endpoint reads
/// (a NUL in the name itself written as the six characters `\u0000`, as
/// for a body key); `detail` says it is a query parameter.
pub(crate) fn nul_in_query(query: &str) -> Option<crate::problem::Problem> {
    if !query.contains("%00") {
        return None;
    }
    // Decoded as the handlers' extractor decodes it (`+` a space, lossy
    // UTF-8), so the name is the one every other problem of it carries.
    let decoded = actix_web::web::Query::<Vec<(String, String)>>::from_query(query)
        .map(actix_web::web::Query::into_inner)
        .unwrap_or_default();
    let name = match decoded
        .into_iter()
        .find(|(name, value)| name.contains('\0') || value.contains('\0'))
    {
        Some((name, _)) => name,
        // Not decodable as pairs: the raw name of the first pair holding it.
        None => query
            .split('&')
            .find(|pair| pair.contains("%00"))?
            .split('=')
            .next()
            .unwrap_or_default()
            .replace("%00", "\\u0000"),
    };
    let name = name.replace('\0', "\\u0000");
    Some(
        crate::problem::Problem::new(
            crate::problem::ProblemCode::InvalidField,
            format!("query parameter {name}: must not contain the character U+0000 (NUL)"),
        )
        .with_field(name),
    )
}

/// The middleware function; see the module docs.
pub(crate) async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = client_request_id(&req).unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let method = method_label(req.method());
    let metrics = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.ctx.metrics.clone());
    // Decremented when this request ends, however it ends.
    let _in_flight = metrics.as_ref().map(|m| InFlight::enter(m.clone()));
    let span = tracing::info_span!("request", request_id = %request_id, method = %method, path = %req.path());
    let head = req.method() == actix_web::http::Method::HEAD;
    let mut response = match nul_in_query(req.query_string()) {
        Some(problem) => req.into_response(actix_web::ResponseError::error_response(&problem)),
        None => crate::telemetry::with_request_id(
            request_id.as_str().into(),
            next.call(req).instrument(span.clone()),
        )
        .await?
        .map_into_boxed_body(),
    };
    // A HEAD answer carries no body and so no length: the connection's
    // framing (`wire`) then never expects a body that is not sent.
    if head {
        response =
            response.map_body(|_, _| actix_web::body::BoxBody::new(actix_web::body::None::new()));
    }
    let route = response
        .request()
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_string());
    let status = response.status().as_u16();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        headers.insert(REQUEST_ID, value);
    }
    // Answers carry payment data: no browser sniffs them into something
    // else, and no cache along the way keeps a copy.
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    let elapsed = started.elapsed();
    if let Some(metrics) = metrics {
        metrics
            .http_requests
            .with_label_values(&[&route, method, &status.to_string()])
            .inc();
        metrics
            .http_latency
            .with_label_values(&[&route, method])
            .observe(elapsed.as_secs_f64());
    }
    let cause = response
        .response()
        .extensions()
        .get::<ProblemCause>()
        .map(|c| c.0.clone());
    span.in_scope(|| {
        // The one place a failed request's cause is logged, with its id.
        match cause {
            Some(cause) if status == 500 => tracing::error!(status, route = %route, %cause, "request failed"),
            Some(cause) => tracing::warn!(status, route = %route, %cause, "request refused"),
            None => {}
        }
        tracing::info!(status, route = %route, latency_ms = elapsed.as_secs_f64() * 1e3, "request finished");
    });
    Ok(response)
}

/// What caused a problem answer ([`Problem::cause`](crate::problem::Problem)),
/// carried on the response for [`observe`] to log once.
#[derive(Debug, Clone)]
pub struct ProblemCause(pub String);

/// One request counted in `oncepay_http_requests_in_flight` while it lives.
struct InFlight(std::sync::Arc<crate::metrics::Metrics>);

impl InFlight {
    fn enter(metrics: std::sync::Arc<crate::metrics::Metrics>) -> InFlight {
        metrics.in_flight.inc();
        InFlight(metrics)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::nul_in_query;

    /// Issue 48: `field` is the parameter's bare name, as every other
    /// problem's is; `detail` says it is a query parameter.
    #[test]
    fn a_nul_in_the_query_names_the_parameter_by_its_bare_name() {
        for (query, field) in [
            ("limit=%00", "limit"),
            ("limit=5&status=pa%00id", "status"),
            ("starting_after=%00&limit=%00", "starting_after"),
            ("%6C%69%6D%69%74=%00", "limit"),
            ("created+gte=%00", "created gte"),
            ("customer_id%00=x", "customer_id\\u0000"),
            ("%00", "\\u0000"),
        ] {
            let problem = nul_in_query(query).unwrap_or_else(|| panic!("{query}: refused"));
            assert_eq!(problem.field.as_deref(), Some(field), "{query}");
            assert_eq!(problem.code, "invalid_field", "{query}");
            assert_eq!(problem.status, 400, "{query}");
            assert_eq!(
                problem.detail,
                format!("query parameter {field}: must not contain the character U+0000 (NUL)"),
                "{query}"
            );
        }
        for query in ["", "limit=5", "customer_id=%2500", "a=%0", "a=%01"] {
            assert!(nul_in_query(query).is_none(), "{query}");
        }
    }
}
