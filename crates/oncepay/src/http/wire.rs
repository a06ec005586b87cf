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

/// A connection's stream, with the parser's bare answers made problem
/// documents (see the module docs).
pub struct ProblemIo<IO> {
    io: IO,
    out: Out,
    peer: Option<SocketAddr>,
    metrics: Arc<Metrics>,
}

impl<IO> ProblemIo<IO> {
    /// Wraps a connection from `peer`.
    pub fn new(io: IO, peer: Option<SocketAddr>, metrics: Arc<Metrics>) -> Self {
        ProblemIo {
            io,
            out: Out::Head,
            peer,
            metrics,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for ProblemIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
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
enum Head {
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

fn classify(buf: &[u8]) -> Head {
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
    Head::Forward(head_len as u64 + body)
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
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-request-id: 1\r\n\r\nhello";
        assert_eq!(classify(ok), Head::Forward(ok.len() as u64));
        let empty = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(classify(empty), Head::Forward(empty.len() as u64));
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(classify(chunked), Head::Unknown);
        assert_eq!(classify(b"HTTP/1.1 200 O"), Head::Unknown);
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
