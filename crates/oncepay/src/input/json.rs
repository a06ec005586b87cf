//! Request JSON read with its numbers exact and its strings storable.
//!
//! serde_json reads a number with a fraction or an exponent as an `f64`:
//! `2.0` and `2` become different values (so the same request in two
//! notations got two fingerprints), and `10000000000.00000001` became
//! `10000000000.0` (a fraction silently rounded away). This reader decides
//! each number from its literal, in decimal: a number that is exactly an
//! integer, whatever its notation (`2`, `2.0`, `2e0`, `20e-1`), becomes that
//! integer, so the fingerprint compares what the command reads; a number
//! that is not exactly an integer is refused, naming its field. Every number
//! oncepay reads is an integer (minor units, counts, seconds).
//!
//! It also refuses U+0000 in any string or key, naming the field:
//! PostgreSQL's `text` and `jsonb` cannot hold it, so such a value would
//! otherwise fail deep inside a transaction as a `500`.
//!
//! serde_json checks the syntax first (its messages name line and column);
//! this reader then builds the value from text known to be well formed, and
//! refuses nesting deeper than [`MAX_DEPTH`] levels (as serde_json does when
//! it builds a value; its syntax check alone does not), so its recursion is
//! bounded whatever a client sends.

use serde_json::{Map, Number, Value};

use crate::problem::{Problem, ProblemCode};

/// Nesting deeper than this is refused (`400 malformed_json`).
pub(crate) const MAX_DEPTH: usize = 128;

/// Parses a request body; see the module docs.
pub fn parse(bytes: &[u8]) -> Result<Value, Problem> {
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
        let what = if std::str::from_utf8(bytes).is_err() {
            "the body is not UTF-8 text".to_string()
        } else {
            format!("the body is not valid JSON ({e})")
        };
        return Err(Problem::new(ProblemCode::MalformedJson, what));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Problem::new(ProblemCode::MalformedJson, "the body is not UTF-8 text"))?;
    let mut reader = Reader {
        text,
        pos: 0,
        depth: 0,
    };
    reader.value(&mut String::new())
}

/// Why a well-formed document could not be read, had serde_json and this
/// reader disagreed on its syntax (they do not; this keeps it a `400`).
fn disagreement() -> Problem {
    Problem::new(ProblemCode::MalformedJson, "the body is not valid JSON")
}

/// `400 invalid_field` for a number that is not exactly an integer.
fn not_an_integer(path: &str, literal: &str) -> Problem {
    let field = if path.is_empty() { "body" } else { path };
    Problem::invalid_field(
        field,
        &format!("must be an integer; {literal} is not exactly one"),
    )
}

/// `422 validation_failed` for a string holding U+0000.
fn holds_nul(path: &str) -> Problem {
    // A key holding NUL is named with the NUL written out.
    let path = path.replace('\0', "\\u0000");
    let field = if path.is_empty() { "body" } else { &path };
    Problem::new(
        ProblemCode::ValidationFailed,
        format!("{field}: must not contain the character U+0000 (NUL)"),
    )
    .with_field(field)
}

struct Reader<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, Problem> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(disagreement())
        }
    }

    /// One value at `path` (a JSON path such as `items[0].sku`, empty for the root).
    fn value(&mut self, path: &mut String) -> Result<Value, Problem> {
        self.skip_ws();
        match self.peek().ok_or_else(disagreement)? {
            b'{' | b'[' if self.depth >= MAX_DEPTH => Err(Problem::new(
                ProblemCode::MalformedJson,
                format!("the body nests deeper than {MAX_DEPTH} levels"),
            )),
            b'{' => {
                self.depth += 1;
                let object = self.object(path);
                self.depth -= 1;
                object
            }
            b'[' => {
                self.depth += 1;
                let array = self.array(path);
                self.depth -= 1;
                array
            }
            b'"' => {
                let s = self.string()?;
                if s.contains('\0') {
                    return Err(holds_nul(path));
                }
                Ok(Value::String(s))
            }
            b't' => self.literal("true", Value::Bool(true)),
            b'f' => self.literal("false", Value::Bool(false)),
            b'n' => self.literal("null", Value::Null),
            _ => self.number(path),
        }
    }

    fn object(&mut self, path: &mut String) -> Result<Value, Problem> {
        self.pos += 1;
        let mut map = Map::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            let key = self.string()?;
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&key);
            if key.contains('\0') {
                return Err(holds_nul(path));
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(disagreement());
            }
            self.pos += 1;
            let value = self.value(path)?;
            path.truncate(len);
            // As serde_json: the last of duplicate keys wins.
            map.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(disagreement()),
            }
        }
    }

    fn array(&mut self, path: &mut String) -> Result<Value, Problem> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            let len = path.len();
            path.push_str(&format!("[{}]", items.len()));
            items.push(self.value(path)?);
            path.truncate(len);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(disagreement()),
            }
        }
    }

    /// A string literal, its escapes decoded by serde_json.
    fn string(&mut self) -> Result<String, Problem> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.pos) != Some(&b'"') {
            return Err(disagreement());
        }
        let start = self.pos;
        let mut i = start + 1;
        loop {
            match bytes.get(i) {
                Some(b'\\') => i += 2,
                Some(b'"') => break,
                Some(_) => i += 1,
                None => return Err(disagreement()),
            }
        }
        self.pos = i + 1;
        serde_json::from_str(&self.text[start..=i]).map_err(|_| disagreement())
    }

    fn number(&mut self, path: &str) -> Result<Value, Problem> {
        let start = self.pos;
        while matches!(
            self.peek(),
            Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
        ) {
            self.pos += 1;
        }
        let literal = &self.text[start..self.pos];
        let number = exact_integer(literal)
            .ok_or_else(disagreement)?
            .ok_or_else(|| not_an_integer(path, literal))?;
        Ok(Value::Number(number))
    }
}

/// The integer a JSON number literal denotes: `Some(Some(n))` if it is
/// exactly an integer, `Some(None)` if it has a fraction, `None` if it is
/// not a number literal. Integers beyond `u64` are kept as `f64` (they are
/// far past every limit oncepay accepts, so rounding them changes no
/// answer).
pub(crate) fn exact_integer(literal: &str) -> Option<Option<Number>> {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], exponent(&rest[at + 1..])?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() || !(whole.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    // digits × 10^scale, with the digits' trailing zeros moved into scale.
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some(Some(Number::from(0u64)));
    }
    let fraction_len = i64::try_from(fraction.len()).ok()?;
    let trailing = i64::try_from(digits.len() - significant.len()).ok()?;
    let scale = exponent.checked_sub(fraction_len)?.checked_add(trailing)?;
    if scale < 0 {
        return Some(None);
    }
    let number = if scale <= 19 && significant.len() <= 20 {
        format!("{significant}{}", "0".repeat(scale as usize))
            .parse::<u64>()
            .ok()
            .and_then(|magnitude| {
                if negative {
                    i64::try_from(magnitude)
                        .ok()
                        .map(|m| Number::from(-m))
                        .or_else(|| (magnitude == 1 << 63).then(|| Number::from(i64::MIN)))
                } else {
                    Some(Number::from(magnitude))
                }
            })
    } else {
        None
    };
    let number = number.or_else(|| {
        // Past u64: the nearest f64 (or the largest, for absurd exponents).
        let f = format!("{}{significant}e{scale}", if negative { "-" } else { "" })
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .unwrap_or(if negative { f64::MIN } else { f64::MAX });
        Number::from_f64(f)
    })?;
    Some(Some(number))
}

/// A number literal's exponent (`+12`, `-3`, `7`). One past `i64` is
/// still a valid literal (`0e99999999999999999999` is 0): it saturates at
/// a magnitude no scale arithmetic below can overflow, which is as good
/// as infinite for every rule that reads it.
fn exponent(text: &str) -> Option<i64> {
    const HUGE: i64 = i64::MAX / 4;
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let magnitude = digits.parse::<i64>().unwrap_or(HUGE).min(HUGE);
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponents_past_i64_are_still_numbers() {
        // Found by the json_reader fuzz target's property (serde_json reads
        // these; we answered 400 malformed_json).
        assert_eq!(
            exact_integer("0e99999999999999999999"),
            Some(Some(Number::from(0u64)))
        );
        assert_eq!(exact_integer("1e-99999999999999999999"), Some(None));
        assert_eq!(
            exact_integer("1e99999999999999999999"),
            Some(Number::from_f64(f64::MAX))
        );
        assert_eq!(
            exact_integer("-1E+99999999999999999999"),
            Some(Number::from_f64(f64::MIN))
        );
        assert_eq!(exact_integer("1e"), None);
        assert_eq!(exact_integer("1e+-2"), None);
    }
    use serde_json::json;

    #[test]
    fn an_integer_in_any_notation_is_that_integer() {
        for literal in ["2", "2.0", "2e0", "20e-1", "0.2e1", "2.000", "200E-2"] {
            assert_eq!(
                parse(format!("{{\"q\": {literal}}}").as_bytes()).ok(),
                Some(json!({"q": 2})),
                "{literal}"
            );
        }
        assert_eq!(parse(b"[-0.0, -7, 1e3]").ok(), Some(json!([0, -7, 1000])));
        assert_eq!(
            parse(b"[18446744073709551615, -9223372036854775808]").ok(),
            Some(json!([u64::MAX, i64::MIN]))
        );
        assert_eq!(
            parse(b"1e30").ok().and_then(|v| v.as_f64()),
            Some(1e30),
            "past u64, an f64 that every limit refuses"
        );
    }

    #[test]
    fn a_fraction_is_refused_naming_its_field_never_rounded() {
        let p = parse(br#"{"items": [{"unit_amount": 10000000000.00000001}]}"#)
            .expect_err("not an integer");
        assert_eq!(p.status, 400);
        assert_eq!(p.field.as_deref(), Some("items[0].unit_amount"));
        assert!(p.detail.contains("10000000000.00000001"), "{}", p.detail);
        for literal in ["1.5", "25e-1", "1e-400", "0.1"] {
            assert!(parse(literal.as_bytes()).is_err(), "{literal}");
        }
    }

    #[test]
    fn nul_anywhere_is_refused_naming_the_field() {
        let p = parse(br#"{"url": "https://a.example/x\u0000y"}"#).expect_err("nul");
        assert_eq!((p.status, p.field.as_deref()), (422, Some("url")));
        let p = parse(br#"{"metadata": {"a\u0000": "x"}}"#).expect_err("nul key");
        assert_eq!(p.status, 422);
        let p = parse(br#"{"a": [["\u0000"]]}"#).expect_err("nested");
        assert_eq!(p.field.as_deref(), Some("a[0][0]"));
        assert_eq!(
            parse(br#"{"a": "\u0001 \t \" \\ \u00e9"}"#).ok(),
            Some(json!({"a": "\u{1} \t \" \\ é"}))
        );
    }

    #[test]
    fn it_reads_what_serde_json_reads() {
        let doc = br#" { "a" : [ true , false , null , "x" , { } , [ ] ] , "a" : 1 , "b\"c" : { "d" : -3 } } "#;
        assert_eq!(parse(doc).ok(), serde_json::from_slice(doc).ok());
        assert_eq!(parse(b"{").map_err(|p| p.code), Err("malformed_json"));
        assert_eq!(parse(&[0xff]).map_err(|p| p.code), Err("malformed_json"));
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        assert_eq!(
            parse(deep.as_bytes()).map_err(|p| p.code),
            Err("malformed_json")
        );
        let fine = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(fine.as_bytes()).is_ok());
    }
}
