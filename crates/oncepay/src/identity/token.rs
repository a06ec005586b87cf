//! One bearer token (a JWS in compact serialization) read and checked:
//! its header and issuer before any key is looked up, then its signature
//! and claims with `jsonwebtoken` (ring underneath). Every refusal is a
//! [`Refusal`], whose text is the `401 invalid_token` detail: it says what
//! failed and never repeats the token or a claim's value.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::jwks::PublicKey;
use crate::domain::principal::{is_customer_id, Role};

/// The longest token read: larger is refused before decoding anything.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The longest issuer a merchant can trust (`merchant_identity.issuer`).
pub const MAX_ISSUER_CHARS: usize = 2048;

/// The longest `sub` recorded (a seller's; a customer's is a customer id,
/// at most 64).
pub const MAX_SUB_CHARS: usize = 255;

/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECONDS: u64 = 60;

/// Why a token was refused (the `detail` of `401 invalid_token`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not three base64url parts, or a part that is not the JSON it must be.
    #[error("the token is not a well-formed JWS (three base64url parts: a JSON header, a JSON payload, a signature)")]
    Malformed,
    /// Larger than [`MAX_TOKEN_BYTES`].
    #[error("the token is longer than 16 KiB")]
    TooLong,
    /// `alg` is `none`, an HMAC or anything but the four accepted.
    #[error("the token's alg is not accepted: only RS256, PS256, ES256 and EdDSA are")]
    Algorithm,
    /// The header asks for an extension oncepay does not implement.
    #[error("the token's header has crit, which is not supported")]
    Critical,
    /// No `kid` in the header.
    #[error("the token's header names no kid")]
    NoKid,
    /// No `iss`, or not a string.
    #[error("the token has no iss claim")]
    NoIssuer,
    /// No merchant trusts the issuer.
    #[error("the token's issuer is not trusted by any merchant")]
    UnknownIssuer,
    /// The issuer's key set has no key of the `kid`.
    #[error("no key of the issuer's JWKS has the token's kid")]
    UnknownKid,
    /// The issuer's key set could not be fetched, and none is held.
    #[error("the issuer's JWKS cannot be fetched now")]
    KeysUnavailable,
    /// The key's `kty`, `crv` or `alg` does not fit the header's `alg`.
    #[error("the key with the token's kid is not a key for the token's alg")]
    KeyMismatch,
    /// The key's components are not a valid public key.
    #[error("the key with the token's kid is not a valid public key")]
    BadKey,
    /// The signature does not verify.
    #[error("the token's signature does not verify with the issuer's key")]
    Signature,
    /// `exp` passed (beyond the leeway).
    #[error("the token has expired (exp)")]
    Expired,
    /// `nbf` is still ahead (beyond the leeway).
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// `iat` is ahead (beyond the leeway).
    #[error("the token was issued in the future (iat)")]
    IssuedInFuture,
    /// `aud` does not contain the merchant's audience.
    #[error("the token's aud does not contain the audience this merchant expects")]
    Audience,
    /// A required claim is missing or of the wrong type.
    #[error("the token has no valid {0} claim")]
    Claim(&'static str),
    /// A `sub` oncepay cannot record: longer than 255 characters or
    /// holding U+0000, or for a customer not a customer id.
    #[error("the token's sub cannot be recorded (1 to 255 characters without U+0000; a customer's at most 64)")]
    Subject,
}

/// What the header and payload say before anything is verified: enough
/// to find the issuer's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unverified {
    /// The header's `alg`, one of the four accepted.
    pub alg: Algorithm,
    /// The header's `kid`.
    pub kid: String,
    /// The payload's `iss`.
    pub issuer: String,
}

/// Whether a bearer value is a token rather than an API key: three
/// dot-separated parts (a key is `opk_` and hex).
pub fn is_token(bearer: &str) -> bool {
    !bearer.starts_with(crate::api_keys::PREFIX) && bearer.split('.').count() == 3
}

fn part(text: &str) -> Result<Map<String, Value>, Refusal> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| Refusal::Malformed)?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Refusal::Malformed),
    }
}

/// Reads the header and the issuer of `token`, refusing what no key
/// could make valid.
pub fn peek(token: &str) -> Result<Unverified, Refusal> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Refusal::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    let header = part(header)?;
    let alg = match header.get("alg").and_then(Value::as_str) {
        Some("RS256") => Algorithm::RS256,
        Some("PS256") => Algorithm::PS256,
        Some("ES256") => Algorithm::ES256,
        Some("EdDSA") => Algorithm::EdDSA,
        _ => return Err(Refusal::Algorithm),
    };
    if header.contains_key("crit") {
        return Err(Refusal::Critical);
    }
    let kid = header
        .get("kid")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .ok_or(Refusal::NoKid)?
        .to_string();
    let issuer = part(payload)?
        .get("iss")
        .and_then(Value::as_str)
        .filter(|i| !i.is_empty())
        .ok_or(Refusal::NoIssuer)?
        .to_string();
    // No merchant's issuer is longer or holds U+0000 (which PostgreSQL
    // cannot even be asked about): refused without a lookup.
    if issuer.chars().count() > MAX_ISSUER_CHARS || issuer.contains('\0') {
        return Err(Refusal::UnknownIssuer);
    }
    Ok(Unverified { alg, kid, issuer })
}

/// The key type (and curve) an algorithm needs, and its name.
fn needs(alg: Algorithm) -> (&'static str, Option<&'static str>, &'static str) {
    match alg {
        Algorithm::ES256 => ("EC", Some("P-256"), "ES256"),
        Algorithm::EdDSA => ("OKP", Some("Ed25519"), "EdDSA"),
        Algorithm::PS256 => ("RSA", None, "PS256"),
        _ => ("RSA", None, "RS256"),
    }
}

/// The decoding key of `key` for `alg`, if the key is one for it: its own
/// `kty` (and `crv`) must be the algorithm's, and its `alg`, if it names
/// one, the header's.
fn decoding_key(key: &PublicKey, alg: Algorithm) -> Result<DecodingKey, Refusal> {
    let (kty, crv, name) = needs(alg);
    if key.kty != kty
        || crv.is_some_and(|c| key.crv.as_deref() != Some(c))
        || key.alg.as_deref().is_some_and(|a| a != name)
    {
        return Err(Refusal::KeyMismatch);
    }
    let bytes = |i: usize| -> Result<Vec<u8>, Refusal> {
        let text = key.components.get(i).ok_or(Refusal::BadKey)?;
        URL_SAFE_NO_PAD.decode(text).map_err(|_| Refusal::BadKey)
    };
    match kty {
        "RSA" => DecodingKey::from_rsa_components(&key.components[0], &key.components[1])
            .map_err(|_| Refusal::BadKey),
        "EC" => {
            if bytes(0)?.len() != 32 || bytes(1)?.len() != 32 {
                return Err(Refusal::BadKey);
            }
            DecodingKey::from_ec_components(&key.components[0], &key.components[1])
                .map_err(|_| Refusal::BadKey)
        }
        _ => {
            if bytes(0)?.len() != 32 {
                return Err(Refusal::BadKey);
            }
            DecodingKey::from_ed_components(&key.components[0]).map_err(|_| Refusal::BadKey)
        }
    }
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `sub`.
    pub sub: String,
    /// The role its roles claim grants, if any.
    pub role: Option<Role>,
}

/// What a token is checked against: the merchant's identity provider.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// `iss`.
    pub issuer: &'a str,
    /// What `aud` must contain.
    pub audience: &'a str,
    /// The claim that holds the roles.
    pub roles_claim: &'a str,
}

/// Verifies `token` (as [`peek`] read it) with `key`: the signature, then
/// `iss`, `aud`, `exp` and `nbf` (60 s of leeway), `iat` not in the
/// future, `sub`; `now` in seconds since the epoch.
pub fn verify(
    token: &str,
    peeked: &Unverified,
    key: &PublicKey,
    expected: Expected<'_>,
    now: u64,
) -> Result<Claims, Refusal> {
    use jsonwebtoken::errors::ErrorKind;
    let decoding = decoding_key(key, peeked.alg)?;
    let mut validation = Validation::new(peeked.alg);
    validation.leeway = LEEWAY_SECONDS;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.set_audience(&[expected.audience]);
    validation.set_issuer(&[expected.issuer]);
    // `exp` is required and checked below, as a number: jsonwebtoken
    // reads it as a `u64` and takes one that does not fit (a fraction, a
    // negative, 1e20) as absent.
    validation.set_required_spec_claims(&["iss", "aud", "sub"]);
    let data =
        jsonwebtoken::decode::<Map<String, Value>>(token, &decoding, &validation).map_err(|e| {
            match e.kind() {
                ErrorKind::InvalidSignature => Refusal::Signature,
                ErrorKind::ExpiredSignature => Refusal::Expired,
                ErrorKind::ImmatureSignature => Refusal::NotYetValid,
                ErrorKind::InvalidAudience => Refusal::Audience,
                ErrorKind::InvalidIssuer => Refusal::UnknownIssuer,
                ErrorKind::MissingRequiredClaim(claim) => Refusal::Claim(match claim.as_str() {
                    "exp" => "exp",
                    "aud" => "aud",
                    "iss" => "iss",
                    _ => "sub",
                }),
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                    Refusal::KeyMismatch
                }
                ErrorKind::InvalidRsaKey(_)
                | ErrorKind::InvalidEcdsaKey
                | ErrorKind::InvalidKeyFormat => Refusal::BadKey,
                _ => Refusal::Malformed,
            }
        })?;
    let claims = data.claims;
    // jsonwebtoken skips a time claim that does not fit a `u64` (of the
    // wrong type, a fraction, a negative, 1e20) as if absent: each is
    // checked here as a number, whatever its size. RFC 7519's NumericDate
    // may be fractional.
    let number = |name: &'static str| -> Result<Option<f64>, Refusal> {
        claims
            .get(name)
            .map(|v| v.as_f64().ok_or(Refusal::Claim(name)))
            .transpose()
    };
    let (now, leeway) = (now as f64, LEEWAY_SECONDS as f64);
    let exp = number("exp")?.ok_or(Refusal::Claim("exp"))?;
    if exp < now - leeway {
        return Err(Refusal::Expired);
    }
    if number("nbf")?.is_some_and(|nbf| nbf > now + leeway) {
        return Err(Refusal::NotYetValid);
    }
    if number("iat")?.is_some_and(|iat| iat > now + leeway) {
        return Err(Refusal::IssuedInFuture);
    }
    let sub = claims
        .get("sub")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or(Refusal::Claim("sub"))?
        .to_string();
    if sub.chars().count() > MAX_SUB_CHARS || sub.contains('\0') {
        return Err(Refusal::Subject);
    }
    let role = Role::of_claim(claims.get(expected.roles_claim));
    if role == Some(Role::Customer) && !is_customer_id(&sub) {
        return Err(Refusal::Subject);
    }
    Ok(Claims { sub, role })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(v.to_string())
    }

    fn token(header: Value, payload: Value) -> String {
        format!("{}.{}.c2ln", b64(&header), b64(&payload))
    }

    #[test]
    fn tokens_and_keys_are_told_apart() {
        assert!(is_token("a.b.c"));
        assert!(!is_token("opk_0123"));
        assert!(!is_token("opk_a.b.c"));
        assert!(!is_token("a.b"));
        assert!(!is_token("a.b.c.d.e"));
    }

    #[test]
    fn only_four_algorithms_pass_the_header() {
        let payload = serde_json::json!({"iss": "https://idp"});
        for alg in ["RS256", "PS256", "ES256", "EdDSA"] {
            let t = token(serde_json::json!({"alg": alg, "kid": "k"}), payload.clone());
            assert!(peek(&t).is_ok(), "{alg}");
        }
        for alg in [
            "none", "None", "HS256", "HS384", "HS512", "RS384", "ES384", "RS512", "",
        ] {
            let t = token(serde_json::json!({"alg": alg, "kid": "k"}), payload.clone());
            assert_eq!(peek(&t), Err(Refusal::Algorithm), "{alg}");
        }
        let t = token(serde_json::json!({"kid": "k"}), payload.clone());
        assert_eq!(peek(&t), Err(Refusal::Algorithm));
    }

    #[test]
    fn a_header_without_kid_or_with_crit_and_a_payload_without_iss_are_refused() {
        let iss = serde_json::json!({"iss": "https://idp"});
        let t = token(serde_json::json!({"alg": "ES256"}), iss.clone());
        assert_eq!(peek(&t), Err(Refusal::NoKid));
        let t = token(
            serde_json::json!({"alg": "ES256", "kid": "k", "crit": ["b64"]}),
            iss,
        );
        assert_eq!(peek(&t), Err(Refusal::Critical));
        let t = token(
            serde_json::json!({"alg": "ES256", "kid": "k"}),
            serde_json::json!({}),
        );
        assert_eq!(peek(&t), Err(Refusal::NoIssuer));
        let t = token(
            serde_json::json!({"alg": "ES256", "kid": "k"}),
            serde_json::json!({"iss": 7}),
        );
        assert_eq!(peek(&t), Err(Refusal::NoIssuer));
        for iss in [
            "https://idp\u{0}".to_string(),
            "i".repeat(MAX_ISSUER_CHARS + 1),
        ] {
            let t = token(
                serde_json::json!({"alg": "ES256", "kid": "k"}),
                serde_json::json!({ "iss": iss }),
            );
            assert_eq!(peek(&t), Err(Refusal::UnknownIssuer));
        }
        for bad in [
            "a.b.c",
            "..",
            "e30.e30",
            "!!.e30.x",
            &"a".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            assert!(peek(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_key_must_be_of_the_algorithms_type_curve_and_name() {
        let x = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let ec = PublicKey {
            kty: "EC".into(),
            alg: None,
            crv: Some("P-256".into()),
            components: vec![x.clone(), x.clone()],
        };
        assert!(decoding_key(&ec, Algorithm::ES256).is_ok());
        assert_eq!(
            decoding_key(&ec, Algorithm::RS256).err(),
            Some(Refusal::KeyMismatch)
        );
        assert_eq!(
            decoding_key(&ec, Algorithm::EdDSA).err(),
            Some(Refusal::KeyMismatch)
        );
        let p384 = PublicKey {
            crv: Some("P-384".into()),
            ..ec.clone()
        };
        assert_eq!(
            decoding_key(&p384, Algorithm::ES256).err(),
            Some(Refusal::KeyMismatch)
        );
        let named = PublicKey {
            alg: Some("ES384".into()),
            ..ec.clone()
        };
        assert_eq!(
            decoding_key(&named, Algorithm::ES256).err(),
            Some(Refusal::KeyMismatch)
        );
        let short = PublicKey {
            components: vec![x.clone(), "AA".into()],
            ..ec
        };
        assert_eq!(
            decoding_key(&short, Algorithm::ES256).err(),
            Some(Refusal::BadKey)
        );
        let rsa = PublicKey {
            kty: "RSA".into(),
            alg: Some("RS256".into()),
            crv: None,
            components: vec!["AQAB".into(), "AQAB".into()],
        };
        assert_eq!(
            decoding_key(&rsa, Algorithm::PS256).err(),
            Some(Refusal::KeyMismatch)
        );
    }

    #[test]
    fn details_never_carry_a_value() {
        // Every refusal's text is fixed: nothing from a token reaches it.
        let all = [
            Refusal::Malformed,
            Refusal::Algorithm,
            Refusal::UnknownIssuer,
            Refusal::UnknownKid,
            Refusal::Signature,
            Refusal::Expired,
            Refusal::NotYetValid,
            Refusal::Audience,
            Refusal::Claim("sub"),
        ];
        for refusal in all {
            assert!(!refusal.to_string().is_empty());
        }
    }
}
