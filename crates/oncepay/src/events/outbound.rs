//! Requests oncepay sends to merchants' webhook endpoints, guarded against
//! server-side request forgery: a merchant may name any URL, so without a
//! guard oncepay could be made to POST into its own network (a database's
//! HTTP port, a cloud metadata service at 169.254.169.254). Addresses that
//! are loopback, private, link-local, shared, reserved or multicast are
//! refused unless `ONCEPAY_WEBHOOK_ALLOW_PRIVATE=true`.
//!
//! The check runs at registration (a clear `422`) and again at every
//! delivery, on the very addresses the connection uses: the HTTP client
//! resolves names through [`GuardedResolver`], so a name that changes its
//! answer after registration (DNS rebinding) is refused too. The client
//! follows no redirects and uses no proxy from the environment.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;

/// The longest endpoint URL accepted.
pub(crate) const MAX_URL_LEN: usize = 2048;

/// True for an address a merchant's public endpoint may have: not
/// loopback, private, link-local, shared (CGNAT), documentation,
/// benchmarking, reserved, broadcast, multicast or unspecified.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10
                || (s[0] == 0x2001 && s[1] == 0x0db8)) // documentation
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || a == 0
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a >= 240 // reserved
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || (a == 198 && (b == 18 || b == 19))) // benchmarking
}

/// The IPv4 address inside an IPv4-mapped, IPv4-compatible or NAT64
/// address, which reaches that IPv4 host.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let compatible = s[..6].iter().all(|x| *x == 0) && !(s[6] == 0 && s[7] <= 1);
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|x| *x == 0);
    (compatible || nat64).then_some(tail)
}

/// Why an endpoint URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    /// Not a URL oncepay can POST to.
    #[error("must be an absolute http:// or https:// URL with a host, without user name or password, at most 2048 characters")]
    Malformed,
    /// It holds a control character or white space, which a URL parser
    /// silently drops or trims: the URL shown would not be the one called.
    #[error("must not contain control characters or white space (write them percent-encoded)")]
    ControlCharacter,
    /// It is, or resolves to, an address inside a private network.
    #[error("{host} is {ip}, a loopback, private, link-local or reserved address; oncepay sends webhooks only to public addresses")]
    PrivateAddress {
        /// The host as written.
        host: String,
        /// The address refused.
        ip: IpAddr,
    },
}

/// Parses an endpoint URL.
pub(crate) fn parse_url(raw: &str) -> Result<Url, UrlRefused> {
    if raw.len() > MAX_URL_LEN {
        return Err(UrlRefused::Malformed);
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(UrlRefused::ControlCharacter);
    }
    let url = Url::parse(raw).map_err(|_| UrlRefused::Malformed)?;
    let scheme_ok = matches!(url.scheme(), "http" | "https");
    let credentials = !url.username().is_empty() || url.password().is_some();
    if !scheme_ok || credentials || url.host().is_none() {
        return Err(UrlRefused::Malformed);
    }
    Ok(url)
}

/// The IP a URL names literally, if it names one.
fn literal_ip(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn refuse_private(host: &str, ips: impl IntoIterator<Item = IpAddr>) -> Result<(), UrlRefused> {
    match ips.into_iter().find(|ip| !is_public(*ip)) {
        Some(ip) => Err(UrlRefused::PrivateAddress {
            host: host.to_string(),
            ip,
        }),
        None => Ok(()),
    }
}

/// Checks an endpoint URL at registration: its shape, and (unless private
/// addresses are allowed) every address it names or resolves to. A name
/// that does not resolve now is accepted: every delivery checks again.
pub(crate) async fn check_url(raw: &str, allow_private: bool) -> Result<Url, UrlRefused> {
    let url = parse_url(raw)?;
    if allow_private {
        return Ok(url);
    }
    let host = url.host_str().unwrap_or_default().to_string();
    if let Some(ip) = literal_ip(&url) {
        refuse_private(&host, [ip])?;
        return Ok(url);
    }
    let port = url.port_or_known_default().unwrap_or(80);
    if let Ok(addrs) = tokio::net::lookup_host((host.as_str(), port)).await {
        refuse_private(&host, addrs.map(|a| a.ip()))?;
    }
    Ok(url)
}

/// Resolves names for the delivery client and refuses any whose addresses
/// are not all public: the check is made on the addresses connected to.
pub struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !allow_private {
                refuse_private(&host, addrs.iter().map(|a| a.ip()))?;
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client of deliveries.
pub struct Client {
    http: reqwest::Client,
    allow_private: bool,
}

/// What sending one event got.
pub struct Sent {
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// Why it did not answer (or could not be asked), if it did not.
    pub error: Option<String>,
    /// The refused address, when the guard stopped it.
    pub refused: bool,
}

/// The guarded HTTP client of every call oncepay makes to an address a
/// merchant chose (webhook deliveries, identity providers' JWKS): names
/// resolved through [`GuardedResolver`], no redirects, no proxy from the
/// environment, a per-request `timeout`. A literal address never reaches
/// the resolver: check it with [`refuse_private_literal`].
pub(crate) fn guarded_client(
    timeout: Duration,
    allow_private: bool,
    user_agent: &'static str,
) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(user_agent)
        .dns_resolver(Arc::new(GuardedResolver { allow_private }))
        .build()
}

/// Refuses a URL whose host is a literal private address, unless private
/// addresses are allowed (names are checked by the resolver).
pub(crate) fn refuse_private_literal(url: &Url, allow_private: bool) -> Result<(), UrlRefused> {
    match (allow_private, literal_ip(url)) {
        (false, Some(ip)) => refuse_private(url.host_str().unwrap_or_default(), [ip]),
        _ => Ok(()),
    }
}

/// The IP address a URL names literally, if it names one.
pub(crate) fn literal_address(url: &Url) -> Option<IpAddr> {
    literal_ip(url)
}

impl Client {
    /// A client with a per-request `timeout`.
    pub fn new(timeout: Duration, allow_private: bool) -> Result<Client, reqwest::Error> {
        let http = guarded_client(
            timeout,
            allow_private,
            concat!("oncepay-webhooks/", env!("CARGO_PKG_VERSION")),
        )?;
        Ok(Client {
            http,
            allow_private,
        })
    }

    /// POSTs `body` to `url` with the three Standard Webhooks headers.
    pub async fn post(&self, url: &str, headers: [(&str, String); 3], body: Vec<u8>) -> Sent {
        let url = match parse_url(url) {
            Ok(url) => url,
            Err(e) => return refused(e),
        };
        // A literal address never reaches the resolver: checked here.
        if let Err(e) = refuse_private_literal(&url, self.allow_private) {
            return refused(e);
        }
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        match request.send().await {
            Ok(response) => Sent {
                status: Some(response.status().as_u16()),
                error: None,
                refused: false,
            },
            Err(e) => {
                let text = error_chain(&e);
                Sent {
                    status: None,
                    refused: text.contains("oncepay sends webhooks only to public addresses"),
                    error: Some(text),
                }
            }
        }
    }
}

fn refused(e: UrlRefused) -> Sent {
    Sent {
        status: None,
        error: Some(e.to_string()),
        refused: true,
    }
}

/// An error with its causes, which say what actually failed (the top
/// level of a reqwest error says only "error sending request").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.chars().take(500).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "192.0.2.5",
            "198.18.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "::7f00:1",
        ] {
            let parsed: IpAddr = ip.parse().expect("valid");
            assert!(!is_public(parsed), "{ip} must be refused");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let parsed: IpAddr = ip.parse().expect("valid");
            assert!(is_public(parsed), "{ip} is public");
        }
    }

    #[test]
    fn only_plain_http_urls_with_a_host_parse() {
        assert!(parse_url("https://example.com/hooks").is_ok());
        assert!(parse_url("http://example.com:8080/x?y=1").is_ok());
        for bad in [
            "ftp://example.com/",
            "example.com/hook",
            "http://user:pass@example.com/",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "",
        ] {
            assert_eq!(parse_url(bad), Err(UrlRefused::Malformed), "{bad}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(parse_url(&long), Err(UrlRefused::Malformed));
        for bad in [
            "https://example.com/a\nb",
            "https://example.com/a\tb",
            " https://example.com/",
            "https://example.com/\u{7f}",
            "https://example.com/\u{85}",
            "https://exa mple.com/",
        ] {
            assert_eq!(parse_url(bad), Err(UrlRefused::ControlCharacter), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn registration_refuses_private_names_and_literals() {
        for url in [
            "http://127.0.0.1:9000/hook",
            "http://[::1]/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://localhost:8080/hook",
            "http://10.0.0.7/",
        ] {
            let refused = check_url(url, false).await;
            assert!(
                matches!(refused, Err(UrlRefused::PrivateAddress { .. })),
                "{url}: {refused:?}"
            );
            assert!(check_url(url, true).await.is_ok(), "{url} when allowed");
        }
    }
}
