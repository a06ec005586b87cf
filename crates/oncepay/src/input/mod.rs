//! Reading request JSON field by field, so that every error names its field.
//!
//! The split the contract asks for: a field that is missing or of the wrong
//! JSON type is a shape error (`400 invalid_field`); a well-formed value that
//! breaks a rule is left to the domain (`422 validation_failed`). Integers
//! are read as `i128`, and an integral number too large even for that
//! saturates, so "too big" is always a rule violation and never a panic or a
//! silent wrap.

pub mod json;

use serde_json::{Map, Value};

use crate::problem::Problem;

/// Parses a body into JSON: `400 malformed_json` for anything that is not
/// UTF-8 JSON, numbers read exactly and U+0000 refused (see [`json`]). An
/// empty body reads as `{}` for commands whose body is optional.
pub(crate) fn parse_body(bytes: &[u8], empty_is_object: bool) -> Result<Value, Problem> {
    if empty_is_object && bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Value::Object(Map::new()));
    }
    json::parse(bytes)
}

/// A JSON object being read, with its path for error messages.
pub struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads a JSON number as an integer; see the module docs.
fn integer(field: &str, v: &Value) -> Result<i128, Problem> {
    let Value::Number(n) = v else {
        return Err(Problem::invalid_field(
            field,
            &format!("must be an integer, not {}", type_name(v)),
        ));
    };
    if let Some(i) = n.as_i64() {
        return Ok(i as i128);
    }
    if let Some(u) = n.as_u64() {
        return Ok(u as i128);
    }
    match n.as_f64() {
        Some(f) if f.is_finite() && f.fract() == 0.0 => Ok(f as i128),
        _ => Err(Problem::invalid_field(field, "must be an integer")),
    }
}

impl<'a> Obj<'a> {
    /// The top-level body, which must be an object.
    pub fn root(value: &'a Value) -> Result<Obj<'a>, Problem> {
        Obj::at(String::new(), value)
    }

    fn at(path: String, value: &'a Value) -> Result<Obj<'a>, Problem> {
        match value {
            Value::Object(map) => Ok(Obj { path, map }),
            other => {
                let field = if path.is_empty() {
                    "body".to_string()
                } else {
                    path
                };
                Err(Problem::invalid_field(
                    field,
                    &format!("must be a JSON object, not {}", type_name(other)),
                ))
            }
        }
    }

    /// Refuses fields the endpoint does not know, so a typo is not ignored.
    pub fn only(&self, allowed: &[&str]) -> Result<(), Problem> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(unknown) => Err(Problem::invalid_field(
                join(&self.path, unknown),
                "is not a known field",
            )),
            None => Ok(()),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn required(&self, name: &str) -> Result<&'a Value, Problem> {
        self.get(name)
            .ok_or_else(|| Problem::invalid_field(join(&self.path, name), "is required"))
    }

    /// Whether the field is present (and not `null`).
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A required string.
    pub fn string(&self, name: &str) -> Result<String, Problem> {
        let field = join(&self.path, name);
        match self.required(name)? {
            Value::String(s) => Ok(s.clone()),
            other => Err(Problem::invalid_field(
                field,
                &format!("must be a string, not {}", type_name(other)),
            )),
        }
    }

    /// An optional string (absent or null reads as `None`).
    pub fn opt_string(&self, name: &str) -> Result<Option<String>, Problem> {
        match self.get(name) {
            None => Ok(None),
            Some(_) => self.string(name).map(Some),
        }
    }

    /// An optional boolean (absent or null reads as `None`).
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, Problem> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(Problem::invalid_field(
                join(&self.path, name),
                &format!("must be true or false, not {}", type_name(other)),
            )),
        }
    }

    /// A required integer.
    pub fn integer(&self, name: &str) -> Result<i128, Problem> {
        integer(&join(&self.path, name), self.required(name)?)
    }

    /// An optional integer.
    pub fn opt_integer(&self, name: &str) -> Result<Option<i128>, Problem> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => integer(&join(&self.path, name), v).map(Some),
        }
    }

    /// A required array of objects, each handed to `each` with its path.
    pub fn objects<T>(
        &self,
        name: &str,
        mut each: impl FnMut(Obj<'a>) -> Result<T, Problem>,
    ) -> Result<Vec<T>, Problem> {
        let field = join(&self.path, name);
        let Value::Array(items) = self.required(name)? else {
            return Err(Problem::invalid_field(field, "must be an array"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| each(Obj::at(format!("{field}[{i}]"), v)?))
            .collect()
    }

    /// A required array of strings.
    pub fn strings(&self, name: &str) -> Result<Vec<String>, Problem> {
        let field = join(&self.path, name);
        let Value::Array(items) = self.required(name)? else {
            return Err(Problem::invalid_field(field, "must be an array of strings"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(Problem::invalid_field(
                    format!("{field}[{i}]"),
                    &format!("must be a string, not {}", type_name(other)),
                )),
            })
            .collect()
    }

    /// An optional object of string values.
    pub fn string_map(&self, name: &str) -> Result<Vec<(String, String)>, Problem> {
        let field = join(&self.path, name);
        let Some(value) = self.get(name) else {
            return Ok(Vec::new());
        };
        let Value::Object(map) = value else {
            return Err(Problem::invalid_field(
                field,
                "must be an object of strings",
            ));
        };
        map.iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(Problem::invalid_field(
                    format!("{field}.{k}"),
                    &format!("must be a string, not {}", type_name(other)),
                )),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(p: Problem) -> (u16, Option<String>) {
        (p.status, p.field)
    }

    #[test]
    fn wrong_types_name_the_nested_field() {
        let v = json!({"items": [{"sku": "a"}, {"sku": 5}]});
        let root = Obj::root(&v).expect("object");
        let err = root
            .objects("items", |o| o.string("sku"))
            .expect_err("second sku is a number");
        assert_eq!(field_of(err), (400, Some("items[1].sku".into())));
    }

    #[test]
    fn integers_are_read_without_overflow() {
        let v = json!({"a": 5, "b": 1e30, "c": 1.5, "d": "7", "e": -3});
        let o = Obj::root(&v).expect("object");
        assert_eq!(o.integer("a").ok(), Some(5));
        assert!(o.integer("b").is_ok_and(|n| n > 1_000_000_000_000));
        assert_eq!(o.integer("c").map_err(|p| p.status), Err(400));
        assert_eq!(o.integer("d").map_err(|p| p.status), Err(400));
        assert_eq!(o.integer("e").ok(), Some(-3));
        assert_eq!(
            o.integer("missing").map_err(|p| p.field),
            Err(Some("missing".into()))
        );
    }

    #[test]
    fn malformed_bodies_are_400() {
        assert_eq!(
            parse_body(b"{", false).map_err(|p| p.code),
            Err("malformed_json")
        );
        assert_eq!(
            parse_body(&[0xff, 0x00], false).map_err(|p| p.code),
            Err("malformed_json")
        );
        assert_eq!(parse_body(b"", true).ok(), Some(json!({})));
        assert_eq!(parse_body(b"", false).map_err(|p| p.status), Err(400));
        let err = Obj::root(&json!([1])).err().map(|p| p.field);
        assert_eq!(err, Some(Some("body".into())));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let v = json!({"a": 1, "zz": 2});
        let err = Obj::root(&v)
            .and_then(|o| o.only(&["a"]))
            .expect_err("zz unknown");
        assert_eq!(err.field.as_deref(), Some("zz"));
    }
}
