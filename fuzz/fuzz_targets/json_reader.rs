//! `input::json::parse`, the reader of every request body.
//!
//! Properties, for any bytes:
//! - no panic, and time and memory bounded (libFuzzer's `-timeout`,
//!   `-rss_limit_mb`, `-malloc_limit_mb`, see run.sh);
//! - the same bytes get the same answer;
//! - what serde_json refuses (syntax, or not UTF-8) we refuse, `400
//!   malformed_json`;
//! - on a document serde_json's syntax check accepts, our answer is exactly
//!   the one an independent, document-order reading of its tokens predicts
//!   (status, code and the field named), from the reader's documented rules,
//!   which are its only deliberate differences from serde_json:
//!   1. a number that is not exactly an integer is refused, `400
//!      invalid_field` naming its field (serde_json rounds it to an f64);
//!   2. U+0000 in a string or a key is refused, `422 validation_failed`
//!      naming its field (serde_json keeps it);
//!   3. nesting deeper than `MAX_DEPTH` (128) is refused, `400
//!      malformed_json`; serde_json's `Value` stops one level earlier
//!      (127: its recursion limit), so a document nested exactly 128 deep is
//!      ours only;
//!   4. an integer beyond f64's range is kept as the largest f64 (serde_json
//!      refuses it: "number out of range");
//!   and, as serde_json, the last of duplicate keys wins (but a refused
//!   value anywhere, even under a key overwritten later, refuses the body);
//! - where both accept, both read the same document: the same strings and
//!   keys, and each number the same value (ours an exact integer).

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncepay::fuzzing::JSON_MAX_DEPTH;
use oncepay::input::json;
use oncepay::problem::Problem;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let ours = json::parse(data);
    assert_eq!(ours, json::parse(data), "the same bytes, another answer");

    let syntax = serde_json::from_slice::<serde::de::IgnoredAny>(data);
    let text = match (syntax, std::str::from_utf8(data)) {
        (Ok(_), Ok(text)) => text,
        _ => {
            let p = ours
                .as_ref()
                .expect_err("serde_json refuses it (or it is not UTF-8), and we accept it");
            assert_eq!(
                (p.status, p.code, p.field.as_deref()),
                (400, "malformed_json", None)
            );
            return;
        }
    };

    let scan = Scan::of(text);
    assert_eq!(
        verdict_of(&ours),
        scan.verdict,
        "our answer is not what the documented rules predict for {text:?}"
    );

    match (&ours, serde_json::from_slice::<Value>(data)) {
        (Ok(v), Ok(theirs)) => assert!(
            same_document(v, &theirs),
            "both accept {text:?}, but read {v:?} and {theirs:?}"
        ),
        (Ok(_), Err(e)) => {
            let why = e.to_string();
            let deliberate = (why.starts_with("recursion limit exceeded")
                && scan.max_depth == JSON_MAX_DEPTH)
                || (why.starts_with("number out of range") && scan.beyond_f64);
            assert!(
                deliberate,
                "serde_json refuses {text:?} ({why}), we accept it"
            );
        }
        (Err(p), Ok(_)) => assert!(
            matches!(
                (p.status, p.code),
                (400, "invalid_field") | (422, "validation_failed")
            ),
            "serde_json accepts {text:?}, we refuse it: {p:?}"
        ),
        (Err(_), Err(_)) => {}
    }
});

/// An answer reduced to what the rules decide: accepted, or refused with
/// this status, code and field.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Accept,
    Refuse(u16, &'static str, Option<String>),
}

fn verdict_of(answer: &Result<Value, Problem>) -> Verdict {
    match answer {
        Ok(_) => Verdict::Accept,
        Err(p) => Verdict::Refuse(p.status, p.code, p.field.clone()),
    }
}

/// One open object or array, as the scan walks the document.
struct Frame {
    array: bool,
    /// Arrays: the index of the current element.
    index: usize,
    /// Objects: the current key (decoded).
    key: Option<String>,
    /// Objects: whether the next string is a key.
    expect_key: bool,
}

/// The answer the rules predict for a well-formed document, from its tokens
/// in document order (the first rule broken decides), and what serde_json's
/// own refusals depend on.
struct Scan {
    verdict: Verdict,
    /// The deepest nesting reached (up to the first refusal).
    max_depth: usize,
    /// Whether an integer too large for an f64 was read.
    beyond_f64: bool,
}

impl Scan {
    fn of(text: &str) -> Scan {
        let bytes = text.as_bytes();
        let mut stack: Vec<Frame> = Vec::new();
        let mut scan = Scan {
            verdict: Verdict::Accept,
            max_depth: 0,
            beyond_f64: false,
        };
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'{' | b'[' => {
                    if stack.len() >= JSON_MAX_DEPTH {
                        scan.verdict = Verdict::Refuse(400, "malformed_json", None);
                        return scan;
                    }
                    stack.push(Frame {
                        array: bytes[i] == b'[',
                        index: 0,
                        key: None,
                        expect_key: bytes[i] == b'{',
                    });
                    scan.max_depth = scan.max_depth.max(stack.len());
                    i += 1;
                }
                b'}' | b']' => {
                    stack.pop();
                    i += 1;
                }
                b',' => {
                    if let Some(top) = stack.last_mut() {
                        if top.array {
                            top.index += 1;
                        } else {
                            top.expect_key = true;
                        }
                    }
                    i += 1;
                }
                b':' => {
                    if let Some(top) = stack.last_mut() {
                        top.expect_key = false;
                    }
                    i += 1;
                }
                b'"' => {
                    let mut end = i + 1;
                    while bytes[end] != b'"' {
                        end += if bytes[end] == b'\\' { 2 } else { 1 };
                    }
                    let literal = &text[i..=end];
                    i = end + 1;
                    let Ok(s) = serde_json::from_str::<String>(literal) else {
                        // A lone surrogate: serde_json's syntax check lets
                        // it by, no string can hold it.
                        scan.verdict = Verdict::Refuse(400, "malformed_json", None);
                        return scan;
                    };
                    let is_key = stack.last().is_some_and(|f| !f.array && f.expect_key);
                    if is_key {
                        if let Some(top) = stack.last_mut() {
                            top.key = Some(s.clone());
                        }
                    }
                    if s.contains('\0') {
                        let field = body_if_empty(path(&stack).replace('\0', "\\u0000"));
                        scan.verdict = Verdict::Refuse(422, "validation_failed", Some(field));
                        return scan;
                    }
                }
                b'-' | b'0'..=b'9' => {
                    let start = i;
                    while i < bytes.len()
                        && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    {
                        i += 1;
                    }
                    let literal = &text[start..i];
                    if !is_integer(literal) {
                        let field = body_if_empty(path(&stack));
                        scan.verdict = Verdict::Refuse(400, "invalid_field", Some(field));
                        return scan;
                    }
                    if literal.parse::<f64>().is_ok_and(f64::is_infinite) {
                        scan.beyond_f64 = true;
                    }
                }
                // Whitespace, and the letters of true, false and null.
                _ => i += 1,
            }
        }
        scan
    }
}

/// The JSON path the reader names a field by: `items[0].sku`.
fn path(stack: &[Frame]) -> String {
    let mut path = String::new();
    for frame in stack {
        if frame.array {
            path.push_str(&format!("[{}]", frame.index));
        } else if let Some(key) = &frame.key {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
        }
    }
    path
}

fn body_if_empty(path: String) -> String {
    if path.is_empty() {
        "body".to_string()
    } else {
        path
    }
}

/// Whether a well-formed JSON number literal denotes an integer, decided
/// apart from the reader: its digits D, its fraction's length f and its
/// exponent e make D × 10^(e − f), an integer iff D is zero or D's trailing
/// zeros are at least f − e. The exponent saturates (an exponent of a
/// hundred digits is still an exponent).
fn is_integer(literal: &str) -> bool {
    let unsigned = literal.strip_prefix('-').unwrap_or(literal);
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], saturating_exponent(&unsigned[at + 1..])),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    if digits.bytes().all(|b| b == b'0') {
        return true;
    }
    let trailing_zeros = (digits.len() - digits.trim_end_matches('0').len()) as i128;
    trailing_zeros >= fraction.len() as i128 - exponent
}

fn saturating_exponent(text: &str) -> i128 {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits = digits.trim_start_matches('0');
    let magnitude: i128 = if digits.len() > 30 {
        10i128.pow(30)
    } else {
        digits.parse().unwrap_or(0)
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// Both readings of one document: the same shape, strings and keys, and
/// each number the same value, ours an exact integer.
fn same_document(ours: &Value, theirs: &Value) -> bool {
    match (ours, theirs) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::String(a), Value::String(b)) => a == b,
        (Value::Number(a), Value::Number(b)) => {
            let integral = a.is_i64()
                || a.is_u64()
                || a.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() >= 9.2e18);
            let same = if b.is_i64() || b.is_u64() {
                a.as_i64() == b.as_i64() && a.as_u64() == b.as_u64()
            } else {
                a.as_f64() == b.as_f64()
            };
            integral && same
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_document(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, x)| b.get(k).is_some_and(|y| same_document(x, y)))
        }
        _ => false,
    }
}
