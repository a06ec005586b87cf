//! The wire wrapper (`http::wire`): the reading of a response head
//! (`classify`) and the stream (`ProblemIo`) that replaces the HTTP/1
//! parser's bare answers (`400`, `408`, `431`, `500` with `content-length:
//! 0` and no header but `connection` and `date`) with problem documents.
//! What it reads is what the server writes, in answer to what a stranger
//! sent.
//!
//! Input: two bytes that shape the I/O, then the bytes written to the
//! connection (and, apart, read from it). The first byte: its low four bits
//! are the most the socket takes or gives a call (0: all), its high bit
//! makes the socket answer `Pending` every other call. The second: the size
//! of the writer's chunks (0: one chunk).
//!
//! Properties, for any bytes:
//! - no panic (overflow checks on), time and memory bounded;
//! - `classify` says what the module docs say, decided apart from it (with
//!   the same head parser, httparse): `Replace` exactly for a complete head
//!   of a bare parser's answer, `Unknown` for an incomplete head, a
//!   `content-length` that is not a number or a chunked answer, else
//!   `Forward` of the head and the body its length and status say (and
//!   `Unknown` where that sum is past `u64`: no overflow);
//! - the stream acknowledges every byte written, at most what it was
//!   given a call and at least one; what reaches the socket is what was
//!   written, or a prefix of it followed by exactly one problem document
//!   (a complete answer: a known status, `application/problem+json`, a
//!   request id, `connection: close` and the body its length says) put in
//!   place of a bare parser's answer;
//! - read side (the same bytes, as a client's): reading ends; either the
//!   dispatcher reads exactly what the client sent and nothing is written,
//!   or (a TLS handshake on the plain-HTTP port, which starts with `0x16`)
//!   it reads nothing and the client gets exactly one `400` problem
//!   document.

#![no_main]

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use oncepay::fuzzing::{wire_classify, WireHead};
use oncepay::http::wire::ProblemIo;
use oncepay::metrics::Metrics;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fuzz_target!(|data: &[u8]| {
    let [io_shape, chunk, stream @ ..] = data else {
        return;
    };
    check_classify(stream);
    check_stream(*io_shape, *chunk, stream);
    check_read(*io_shape, stream);
});

/// What the module docs say `classify` makes of `buf`.
fn expected(buf: &[u8]) -> WireHead {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return WireHead::Unknown,
    };
    let status = response.code.unwrap_or(0);
    let mut length = None;
    let mut only_connection_and_date = true;
    let mut chunked = false;
    for h in response.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                match std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                {
                    Some(n) => length = Some(n),
                    None => return WireHead::Unknown,
                }
            }
            "connection" | "date" => {}
            other => {
                only_connection_and_date = false;
                chunked |= other == "transfer-encoding";
            }
        }
    }
    if only_connection_and_date && length == Some(0) && [400, 408, 431, 500].contains(&status) {
        return WireHead::Replace {
            head_len,
            status,
            http10: response.version == Some(0),
        };
    }
    if chunked {
        return WireHead::Unknown;
    }
    let body = match status {
        100..=199 | 204 | 304 => 0,
        _ => length.unwrap_or(0),
    };
    // A length that cannot be counted is framing it cannot follow.
    match u64::try_from(head_len as u128 + u128::from(body)) {
        Ok(total) => WireHead::Forward(total),
        Err(_) => WireHead::Unknown,
    }
}

/// `classify` at the start of each answer of the stream, as `ProblemIo`
/// follows them.
fn check_classify(stream: &[u8]) {
    let mut at = 0;
    while at < stream.len() {
        let buf = &stream[at..];
        let got = wire_classify(buf);
        assert_eq!(got, expected(buf), "{:?}", String::from_utf8_lossy(buf));
        match got {
            WireHead::Forward(n) => {
                assert!(n > 0, "a Forward of nothing never moves on");
                match usize::try_from(n) {
                    Ok(n) if n < buf.len() => at += n,
                    _ => break,
                }
            }
            WireHead::Replace { .. } | WireHead::Unknown => break,
        }
    }
}

/// A socket that takes (and gives) at most `step` bytes a call, and
/// answers `Pending` every other call if `stutter`. What it took is shared:
/// `ProblemIo` does not give its stream back.
struct Socket {
    written: Rc<RefCell<Vec<u8>>>,
    /// What the client sends, from `read_at` on.
    incoming: Vec<u8>,
    read_at: usize,
    step: usize,
    stutter: bool,
    turn: bool,
}

impl Socket {
    fn new(written: Rc<RefCell<Vec<u8>>>, io_shape: u8, incoming: &[u8]) -> Socket {
        Socket {
            written,
            incoming: incoming.to_vec(),
            read_at: 0,
            step: match io_shape & 0x0f {
                0 => usize::MAX,
                n => usize::from(n),
            },
            stutter: io_shape & 0x80 != 0,
            turn: false,
        }
    }

    /// Whether this call is the stuttering socket's `Pending`.
    fn stutters(&mut self) -> bool {
        if self.stutter {
            self.turn = !self.turn;
        }
        self.stutter && self.turn
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.stutters() {
            return Poll::Pending;
        }
        let n = buf.len().min(self.step);
        self.written.borrow_mut().extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.stutters() {
            return Poll::Pending;
        }
        let left = self.incoming.len() - self.read_at;
        let n = left.min(self.step).min(buf.remaining());
        let at = self.read_at;
        buf.put_slice(&self.incoming[at..at + n]);
        self.read_at += n;
        Poll::Ready(Ok(()))
    }
}

fn metrics() -> Arc<Metrics> {
    static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
    METRICS.get_or_init(|| Arc::new(Metrics::new())).clone()
}

fn check_stream(io_shape: u8, chunk: u8, stream: &[u8]) {
    let written = Rc::new(RefCell::new(Vec::new()));
    let socket = Socket::new(written.clone(), io_shape, &[]);
    let mut io = ProblemIo::new(socket, None, metrics());
    let mut cx = Context::from_waker(Waker::noop());
    let chunk = if chunk == 0 {
        stream.len().max(1)
    } else {
        usize::from(chunk)
    };
    // Each call either makes progress or is the socket's one Pending in two.
    let mut budget = 4 * (stream.len() + 4096);
    for piece in stream.chunks(chunk) {
        let mut at = 0;
        while at < piece.len() {
            budget = budget.checked_sub(1).expect("the stream makes no progress");
            match Pin::new(&mut io).poll_write(&mut cx, &piece[at..]) {
                Poll::Pending => {}
                Poll::Ready(Ok(n)) => {
                    assert!(
                        (1..=piece.len() - at).contains(&n),
                        "acknowledged {n} of {} bytes",
                        piece.len() - at
                    );
                    at += n;
                }
                Poll::Ready(Err(e)) => panic!("the socket takes everything, yet: {e}"),
            }
        }
    }
    drop(io);
    let written = written.take();
    if written == stream {
        return;
    }
    // A prefix of the stream, then one problem document in place of a bare
    // parser's answer that started there.
    let common = written
        .iter()
        .zip(stream)
        .take_while(|(a, b)| a == b)
        .count();
    let replaced_at = (0..=common)
        .filter(|&at| written[at..].starts_with(b"HTTP/1."))
        .find(|&at| {
            is_problem_answer(&written[at..])
                && matches!(wire_classify(&stream[at..]), WireHead::Replace { .. })
        });
    assert!(
        replaced_at.is_some(),
        "the socket got neither the stream nor a prefix of it and one problem answer:\n\
         stream:  {:?}\nwritten: {:?}",
        String::from_utf8_lossy(stream),
        String::from_utf8_lossy(&written)
    );
}

/// The same bytes as a client's: what the dispatcher reads, and what the
/// client is answered before the dispatcher writes anything.
fn check_read(io_shape: u8, incoming: &[u8]) {
    let written = Rc::new(RefCell::new(Vec::new()));
    let socket = Socket::new(written.clone(), io_shape, incoming);
    let mut io = ProblemIo::new(socket, None, metrics());
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = Vec::new();
    let mut budget = 4 * (incoming.len() + 4096);
    loop {
        budget = budget.checked_sub(1).expect("reading makes no progress");
        let mut space = [0u8; 8192];
        let mut buf = ReadBuf::new(&mut space);
        match Pin::new(&mut io).poll_read(&mut cx, &mut buf) {
            Poll::Pending => continue,
            Poll::Ready(Err(e)) => panic!("the socket gives everything, yet: {e}"),
            Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
            Poll::Ready(Ok(())) => read.extend_from_slice(buf.filled()),
        }
    }
    drop(io);
    let written = written.take();
    if written.is_empty() {
        assert_eq!(
            read, incoming,
            "the dispatcher reads other bytes than the client's"
        );
    } else {
        assert!(
            read.is_empty(),
            "answered, yet the dispatcher read {read:?}"
        );
        assert_eq!(
            incoming.first(),
            Some(&0x16),
            "answered a client that sent no TLS record"
        );
        assert!(
            is_problem_answer(&written) && written.starts_with(b"HTTP/1.1 400 "),
            "the client got {:?}",
            String::from_utf8_lossy(&written)
        );
    }
}

/// A whole problem answer, and nothing after it.
fn is_problem_answer(bytes: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut response = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head_len)) = response.parse(bytes) else {
        return false;
    };
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let body = &bytes[head_len..];
    let length_ok = header("content-length")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<usize>().ok())
        == Some(body.len());
    let code = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("code").and_then(|c| c.as_str()).map(str::to_string));
    length_ok
        && matches!(response.code, Some(400 | 408 | 431 | 500))
        && header("content-type") == Some(&b"application/problem+json"[..])
        && header("connection") == Some(&b"close"[..])
        && header("x-request-id").is_some_and(|id| id.len() == 36)
        && code.is_some()
}
