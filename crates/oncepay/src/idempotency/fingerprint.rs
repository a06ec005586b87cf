//! The request fingerprint: SHA-256 over method, path and the body as
//! canonical JSON, so key order and white space never change it and any
//! value change does.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 of a request's method, path and canonical body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Fingerprints a parsed request.
    pub fn of(method: &str, path: &str, body: &Value) -> Fingerprint {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update(b"\n");
        hasher.update(path.as_bytes());
        hasher.update(b"\n");
        let mut canonical = Vec::with_capacity(256);
        write_canonical(body, &mut canonical);
        hasher.update(&canonical);
        Fingerprint(hasher.finalize().into())
    }

    /// The raw digest, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Writes `value` as canonical JSON: object keys sorted by their UTF-8 bytes,
/// no insignificant white space, strings and numbers as serde_json writes
/// them. Sorting here (rather than relying on `serde_json::Map` being a
/// `BTreeMap`) keeps the fingerprint stable even if some dependency turns on
/// serde_json's `preserve_order` feature.
pub(crate) fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(k.clone()), out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Serialising a scalar Value into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// The canonical JSON text of a value.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fp(body: &str) -> Fingerprint {
        let value: Value = serde_json::from_str(body).expect("test JSON");
        Fingerprint::of("POST", "/orders", &value)
    }

    #[test]
    fn key_order_and_spacing_do_not_matter() {
        let a = fp(r#"{"a":1,"b":{"y":[1,2],"x":"s"}}"#);
        let b = fp("{ \"b\" : { \"x\" : \"s\", \"y\" : [ 1 , 2 ] },\n \"a\" : 1 }");
        assert_eq!(a, b);
    }

    #[test]
    fn any_value_change_does() {
        let base = fp(r#"{"a":1,"b":[1,2]}"#);
        for other in [
            r#"{"a":2,"b":[1,2]}"#,
            r#"{"a":1,"b":[2,1]}"#,
            r#"{"a":"1","b":[1,2]}"#,
            r#"{"a":1,"b":[1,2],"c":null}"#,
            r#"{"a":1.5,"b":[1,2]}"#,
        ] {
            assert_ne!(base, fp(other), "{other}");
        }
    }

    #[test]
    fn method_and_path_are_part_of_it() {
        let body = json!({"a": 1});
        let a = Fingerprint::of("POST", "/orders", &body);
        assert_ne!(a, Fingerprint::of("POST", "/payments", &body));
        assert_ne!(a, Fingerprint::of("PUT", "/orders", &body));
    }

    #[test]
    fn canonical_text_is_sorted_and_compact() {
        let v = json!({"b": [true, null], "a": "é\"", "c": {"z": 1, "k": -2}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"é\"","b":[true,null],"c":{"k":-2,"z":1}}"#
        );
    }
}
