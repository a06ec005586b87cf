//! The one way the testkit's stand-in servers (the provider fault proxy,
//! the merchant's webhook receiver) listen: a free loopback port, one
//! worker, no signal handling of their own, on the caller's tokio runtime.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use actix_web::{web, App, FromRequest, Handler, HttpServer, Responder};

/// Serves every request with `handler`, which reads `shared` as its
/// `web::Data`; returns the address.
pub fn serve<T, F, Args>(shared: Arc<T>, handler: F) -> std::io::Result<SocketAddr>
where
    T: Send + Sync + 'static,
    F: Handler<Args> + Clone + Send + 'static,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let data = web::Data::from(shared);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(web::PayloadConfig::new(1 << 20))
            .default_service(web::to(handler.clone()))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    tokio::spawn(server);
    Ok(addr)
}

/// Sends `req` (with `body` and only the `headers` named) on to `upstream`
/// and returns its status and body: how the testkit's proxies forward.
pub async fn forward(
    http: &reqwest::Client,
    upstream: &str,
    req: &actix_web::HttpRequest,
    body: actix_web::web::Bytes,
    headers: &[&str],
) -> Result<(u16, actix_web::web::Bytes), String> {
    let method =
        reqwest::Method::from_bytes(req.method().as_str().as_bytes()).map_err(|e| e.to_string())?;
    let mut out = http
        .request(method, format!("{upstream}{}", req.uri()))
        .body(body);
    for (name, value) in req.headers() {
        if headers.contains(&name.as_str()) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = out.send().await.map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let bytes = answer.bytes().await.map_err(|e| e.to_string())?;
    Ok((status, bytes))
}
