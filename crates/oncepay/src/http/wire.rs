//! The connection under the application: every answer is a problem
//! document with a request id, even the ones the HTTP/1 parser gives by
//! itself.
//!
//! actix-http answers a request head it cannot parse (a control character
//! in a header, a malformed request line: `400`), a head that does not
//! arrive in time (`408`) or one too large (`431`) on its own, before any
//! application code runs, with a bare head and no body; it offers no hook
//! to change that. So each connection's stream is wrapped in
//! [`ProblemIo`], which follows the responses written to it and replaces
//! such a bare head with a problem document. It recognises one strictly: a
//! `400`, `408`, `431` or `500` with `content-length: 0` and no header but
//! `connection` and `date`. Every answer of the application carries
//! `x-request-id` (the `observe` middleware sets it on every response), so
//! it can never match. Responses are framed by their `content-length`
//! (the application sends no chunked answers, and HEAD answers carry no
//! length, see `observe`); anything it cannot frame turns it into a plain
//! pass-through for the rest of the connection.
//!
//! The parser's answer is always the last thing written on a connection.
//! While the replacement is being written, the dispatcher's own head is
//! not acknowledged (so nothing it thinks written is lost if it gives up);
//! once it is, everything after is dropped (the parser's `408` can be
//! written twice).
//!
//! A connection that opens with a TLS record (`0x16 0x03`: a client
//! sending `https://` to this plain-HTTP port) never reaches the parser,
//! which would refuse it and have actix-http log the refusal at `ERROR`:
//! [`ProblemIo`] answers it itself with a `400` problem document saying
//! so, logs one `INFO` line, discards the rest of the record and ends the
//! stream for the dispatcher, which then closes the connection quietly.
//! The client's TLS stack reads the answer as a server that does not speak
//! TLS, and gives up before any of its request was sent.

use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metrics::Metrics;
use crate::problem::{Problem, ProblemCode};

/// Where the stream of responses is.
enum Out {
    /// At the start of a response head.
    Head,
    /// Inside a response: this many bytes of it still to pass through.
    Forward(u64),
    /// Writing our problem document instead of the parser's head, which is
    /// acknowledged (as `head_len` bytes) only once ours is written whole.
    Replacing {
        head_len: usize,
        bytes: Vec<u8>,
        sent: usize,
    },
    /// After a replacement: the connection is over, later bytes are dropped.
    Closed,
    /// Framing unknown: every byte passes through untouched.
    Passthrough,
}

/// Where the stream of requests is.
enum In {
    /// Nothing read yet.
    Start,
    /// HTTP (or what the parser makes of it): every byte passes through.
    Http,
    /// A TLS handshake on this plain-HTTP port: our answer is written,
    /// then the rest of the client's record is read and dropped (`read`
    /// bytes of it so far, the first up to 5 of them, its header, kept to
    /// learn its length), so that closing does not reset the connection
    /// under the answer.
    Tls {
        answer: Vec<u8>,
        sent: usize,
        header: Vec<u8>,
        read: usize,
    },
    /// The end of the stream, as far as the dispatcher is told.
    Ended,
}

/// A connection's stream, with the parser's bare answers made problem
/// documents (see the module docs).
pub struct ProblemIo<IO> {
    io: IO,
    out: Out,
    input: In,
    peer: Option<SocketAddr>,
    metrics: Arc<Metrics>,
}

impl<IO> ProblemIo<IO> {
    /// Wraps a connection from `peer`.
    pub fn new(io: IO, peer: Option<SocketAddr>, metrics: Arc<Metrics>) -> Self {
        ProblemIo {
            io,
            out: Out::Head,
            input: In::Start,
            peer,
            metrics,
        }
    }
}

/// The length of the TLS record `bytes` start with (its 5-byte header
/// included), if they start with one of the handshake: content type 22
/// (`0x16`, which no HTTP method can start with), protocol major version 3.
/// With fewer than 5 bytes, the record's length is not known yet: its
/// header's.
pub(crate) fn tls_handshake_record(bytes: &[u8]) -> Option<usize> {
    match bytes {
        [0x16] | [0x16, 0x03, ..] => {}
        _ => return None,
    }
    match bytes {
        [_, _, _, high, low, ..] => Some(5 + usize::from(u16::from_be_bytes([*high, *low]))),
        _ => Some(5),
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for ProblemIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.input {
                In::Http => return Pin::new(&mut this.io).poll_read(cx, buf),
                In::Ended => return Poll::Ready(Ok(())),
                In::Start => {
                    let before = buf.filled().len();
                    ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
                    let read = &buf.filled()[before..];
                    if read.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    if tls_handshake_record(read).is_none() {
                        this.input = In::Http;
                        return Poll::Ready(Ok(()));
                    }
                    let (header, read) = (read[..read.len().min(5)].to_vec(), read.len());
                    // The parser never sees it, and nothing the dispatcher
                    // might write follows our answer.
                    buf.set_filled(before);
                    let (answer, id) = tls_answer();
                    tracing::info!(request_id = %id, peer = ?this.peer,
                        "a TLS handshake reached the plain-HTTP port (a client using https:// here); answered 400 malformed_request");
                    this.metrics
                        .http_requests
                        .with_label_values(&["unparsed", "other", "400"])
                        .inc();
                    this.out = Out::Closed;
                    this.input = In::Tls {
                        answer,
                        sent: 0,
                        header,
                        read,
                    };
                }
                In::Tls {
                    answer,
                    sent,
                    header,
                    read,
                } => {
                    while *sent < answer.len() {
                        match ready!(Pin::new(&mut this.io).poll_write(cx, &answer[*sent..]))? {
                            0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                            n => *sent += n,
                        }
                    }
                    let record = tls_handshake_record(header.as_slice()).unwrap_or(0);
                    if *read < record {
                        let mut scratch = [0u8; 4096];
                        let take = (record - *read).min(scratch.len());
                        let mut rest = ReadBuf::new(&mut scratch[..take]);
                        ready!(Pin::new(&mut this.io).poll_read(cx, &mut rest))?;
                        let got = rest.filled();
                        if got.is_empty() {
                            // The client gave up first: nothing more to drop.
                            this.input = In::Ended;
                            continue;
                        }
                        let missing = 5usize.saturating_sub(header.len()).min(got.len());
                        header.extend_from_slice(&got[..missing]);
                        *read += got.len();
                        continue;
                    }
                    this.input = In::Ended;
                }
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for ProblemIo<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            match &mut this.out {
                Out::Passthrough => return Pin::new(&mut this.io).poll_write(cx, buf),
                Out::Closed => return Poll::Ready(Ok(buf.len())),
                Out::Forward(0) => this.out = Out::Head,
                Out::Forward(left) => {
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    let n = ready!(Pin::new(&mut this.io).poll_write(cx, &buf[..n]))?;
                    *left -= n as u64;
                    return Poll::Ready(Ok(n));
                }
                Out::Replacing {
                    head_len,
                    bytes,
                    sent,
                } => {
                    while *sent < bytes.len() {
                        match ready!(Pin::new(&mut this.io).poll_write(cx, &bytes[*sent..]))? {
                            0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                            n => *sent += n,
                        }
                    }
                    let n = (*head_len).min(buf.len());
                    this.out = Out::Closed;
                    return Poll::Ready(Ok(n));
                }
                Out::Head => {
                    this.out = match classify(buf) {
                        Head::Forward(n) => Out::Forward(n),
                        Head::Unknown => Out::Passthrough,
                        Head::Replace {
                            head_len,
                            status,
                            http10,
                        } => {
                            let (bytes, id) = problem_answer(status, http10);
                            tracing::info!(request_id = %id, status, peer = ?this.peer,
                                "request refused by the HTTP parser; answered with a problem document");
                            this.metrics
                                .http_requests
                                .with_label_values(&["unparsed", "other", &status.to_string()])
                                .inc();
                            Out::Replacing {
                                head_len,
                                bytes,
                                sent: 0,
                            }
                        }
                    }
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    // Vectored writes keep tokio's defaults (through `poll_write`), so no
    // byte can bypass the framing above.
}

/// What a response head at the start of `buf` is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// An answer to pass through: head and body, this many bytes.
    Forward(u64),
    /// The parser's own bare answer, `head_len` bytes.
    Replace {
        head_len: usize,
        status: u16,
        http10: bool,
    },
    /// Not a complete head, or one framed otherwise than by its length.
    Unknown,
}

pub(crate) fn classify(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Head::Unknown,
    };
    let status = response.code.unwrap_or(0);
    let (mut length, mut bare, mut chunked) = (None, true, false);
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            if length.is_none() {
                return Head::Unknown;
            }
        } else if !(h.name.eq_ignore_ascii_case("connection")
            || h.name.eq_ignore_ascii_case("date"))
        {
            bare = false;
            chunked |= h.name.eq_ignore_ascii_case("transfer-encoding");
        }
    }
    if bare && length == Some(0) && matches!(status, 400 | 408 | 431 | 500) {
        return Head::Replace {
            head_len,
            status,
            http10: response.version == Some(0),
        };
    }
    if chunked {
        return Head::Unknown;
    }
    let body = if matches!(status, 100..=199 | 204 | 304) {
        0
    } else {
        length.unwrap_or(0)
    };
    // A length no answer of ours can have is not one to count down.
    match (head_len as u64).checked_add(body) {
        Some(total) => Head::Forward(total),
        None => Head::Unknown,
    }
}

/// The answer to a TLS handshake on this plain-HTTP port, and its request
/// id. A TLS client reads it as a server that does not speak TLS; a person
/// looking at the bytes reads why.
fn tls_answer() -> (Vec<u8>, String) {
    let problem = Problem::new(
        ProblemCode::MalformedRequest,
        "a TLS handshake reached this port, which speaks plain HTTP: use http://, or put TLS in front of it",
    );
    framed(&problem, 400, "Bad Request", false)
}

/// The problem document for a parser's answer, and its request id.
fn problem_answer(status: u16, http10: bool) -> (Vec<u8>, String) {
    let (problem, reason) = match status {
        400 => (
            Problem::new(
                ProblemCode::MalformedRequest,
                "the request is not well-formed HTTP (a control character in a header, a malformed request line or framing)",
            ),
            "Bad Request",
        ),
        408 => (
            Problem::new(
                ProblemCode::RequestTimeout,
                "the request head did not arrive in time (ONCEPAY_HEADER_TIMEOUT)",
            ),
            "Request Timeout",
        ),
        431 => (
            Problem::new(
                ProblemCode::RequestHeadTooLarge,
                "the request head is larger than 128 KiB or has more than 96 header fields",
            ),
            "Request Header Fields Too Large",
        ),
        _ => (Problem::internal(), "Internal Server Error"),
    };
    framed(&problem, status, reason, http10)
}

/// `problem` as a whole HTTP/1 answer that closes the connection, and its
/// request id.
fn framed(problem: &Problem, status: u16, reason: &str, http10: bool) -> (Vec<u8>, String) {
    let body = problem.body();
    let id = uuid::Uuid::now_v7().to_string();
    let mut out = Vec::with_capacity(300 + body.len());
    let _ = write!(
        out,
        "HTTP/1.{} {status} {reason}\r\ncontent-type: application/problem+json\r\n\
         content-length: {}\r\nx-request-id: {id}\r\nx-content-type-options: nosniff\r\n\
         cache-control: no-store\r\nconnection: close\r\n\r\n",
        u8::from(!http10),
        body.len()
    );
    out.extend_from_slice(&body);
    (out, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_parsers_bare_answers_are_replaced() {
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: x\r\n\r\n";
        assert!(matches!(
            classify(bare),
            Head::Replace { status: 400, http10: false, head_len } if head_len == bare.len()
        ));
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nx-request-id: 1\r\n\r\n";
        assert_eq!(classify(ours), Head::Forward(ours.len() as u64));
        // Found by the wire fuzz target: a length past u64 overflowed.
        let huge = b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n";
        assert_eq!(classify(huge), Head::Unknown);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-request-id: 1\r\n\r\nhello";
        assert_eq!(classify(ok), Head::Forward(ok.len() as u64));
        let empty = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(classify(empty), Head::Forward(empty.len() as u64));
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(classify(chunked), Head::Unknown);
        assert_eq!(classify(b"HTTP/1.1 200 O"), Head::Unknown);
    }

    #[test]
    fn a_tls_handshake_record_is_told_from_http() {
        // A ClientHello's record header: handshake, TLS 1.0 record version, 512 bytes.
        assert_eq!(
            tls_handshake_record(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]),
            Some(517)
        );
        assert_eq!(
            tls_handshake_record(&[0x16, 0x03, 0x03, 0x00, 0x05]),
            Some(10)
        );
        // Too short to know the length yet: the header's, at least.
        assert_eq!(tls_handshake_record(&[0x16]), Some(5));
        assert_eq!(tls_handshake_record(&[0x16, 0x03, 0x01]), Some(5));
        for http in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"POST",
            b"\x16\x04",
            b"\x15\x03\x01",
            b"",
        ] {
            assert_eq!(tls_handshake_record(http), None, "{http:?}");
        }
    }

    /// A ClientHello as a TLS client sends it first: a record header and
    /// `len` bytes of handshake.
    fn client_hello(len: u16) -> Vec<u8> {
        let mut hello = vec![0x16, 0x03, 0x01];
        hello.extend_from_slice(&len.to_be_bytes());
        hello.push(0x01);
        hello.resize(5 + usize::from(len), 0x42);
        hello
    }

    #[tokio::test]
    async fn a_tls_handshake_is_answered_here_and_never_reaches_the_parser() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Whole, and in pieces: the rest of the record arriving later, even
        // the rest of its header (a first piece of 2 bytes).
        for pieces in [1, 3, 303] {
            let (mut client, server) = tokio::io::duplex(64 * 1024);
            let mut io = ProblemIo::new(server, None, Arc::new(Metrics::new()));
            let hello = client_hello(600);
            let mut chunks = hello.chunks(hello.len().div_ceil(pieces));
            client
                .write_all(chunks.next().expect("a first piece"))
                .await
                .expect("sent");
            let rest: Vec<u8> = chunks.flatten().copied().collect();
            let sender = tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                client.write_all(&rest).await.expect("the rest");
                let mut answer = Vec::new();
                client.read_to_end(&mut answer).await.expect("answer");
                String::from_utf8(answer).expect("text")
            });
            // What the parser reads: nothing, then the end of the stream.
            let mut parser = Vec::new();
            io.read_to_end(&mut parser).await.expect("read");
            assert!(parser.is_empty(), "{pieces}: the parser saw {parser:?}");
            // Whatever the dispatcher might still write is dropped.
            io.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await
                .expect("swallowed");
            io.shutdown().await.expect("shutdown");
            drop(io);
            let answer = sender.await.expect("client");
            assert!(
                answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{answer}"
            );
            assert!(
                answer.contains("content-type: application/problem+json"),
                "{answer}"
            );
            assert!(answer.contains("x-request-id: "), "{answer}");
            assert!(answer.contains("connection: close"), "{answer}");
            assert!(
                answer.contains("\"code\":\"malformed_request\""),
                "{answer}"
            );
            assert!(answer.contains("TLS handshake"), "{answer}");
            assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer}");
        }
        // A request passes through untouched.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut io = ProblemIo::new(server, None, Arc::new(Metrics::new()));
        let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        client.write_all(request).await.expect("sent");
        drop(client);
        let mut parser = Vec::new();
        io.read_to_end(&mut parser).await.expect("read");
        assert_eq!(parser, request);
    }

    /// A writer that takes at most `step` bytes a call and says `Pending`
    /// every other call.
    struct Trickle {
        written: Vec<u8>,
        step: usize,
        turn: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.turn = !self.turn;
            if self.turn {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = buf.len().min(self.step);
            self.written.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_pipelined_answer_then_the_parsers_is_framed_through_partial_writes() {
        use tokio::io::AsyncWriteExt;
        let first =
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-request-id: a\r\n\r\nhello".to_vec();
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n".to_vec();
        let mut io = ProblemIo::new(
            Trickle {
                written: Vec::new(),
                step: 7,
                turn: false,
            },
            None,
            Arc::new(Metrics::new()),
        );
        io.write_all(&[first.clone(), bare.clone(), bare].concat())
            .await
            .expect("written");
        let written = String::from_utf8(io.io.written).expect("text");
        let (kept, replaced) = written.split_at(first.len());
        assert_eq!(
            kept.as_bytes(),
            &first[..],
            "the application's answer untouched"
        );
        assert!(
            replaced.starts_with(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\n"
            ),
            "{replaced}"
        );
        assert!(replaced.contains("x-request-id: "));
        assert!(
            replaced.ends_with("\"code\":\"malformed_request\"}"),
            "{replaced}"
        );
        assert_eq!(
            replaced.matches("HTTP/1.1 400").count(),
            1,
            "a second bare answer is dropped"
        );
    }
}
