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
    /// The header's `typ` names another kind of token than the merchant
    /// accepts.
    #[error("the token's typ is not a type this merchant accepts (JWT or at+jwt unless `oncepay merchant identity --token-type` names one)")]
    TokenType,
    /// The header's `alg` is one of the four, but not one the merchant's
    /// identity provider signs with.
    #[error("the token's alg is not one this merchant's identity provider signs with (`oncepay merchant identity --algorithms`)")]
    AlgorithmNotTrusted,
}

/// The algorithms a merchant's identity provider signs with (`oncepay
/// merchant identity --algorithms`): a non-empty subset of the four
/// accepted. Besides refusing the others, it decides the one algorithm an
/// RSA key that names none verifies ([`Algorithms::unnamed_rsa`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Algorithms(u8);

/// The four algorithms by name, in the order they are listed.
const NAMED: [(Algorithm, &str); 4] = [
    (Algorithm::RS256, "RS256"),
    (Algorithm::PS256, "PS256"),
    (Algorithm::ES256, "ES256"),
    (Algorithm::EdDSA, "EdDSA"),
];

impl Algorithms {
    /// All four: the default.
    pub const ALL: Algorithms = Algorithms(0b1111);

    fn bit(alg: Algorithm) -> u8 {
        NAMED
            .iter()
            .position(|(a, _)| *a == alg)
            .map_or(0, |i| 1 << i)
    }

    /// Whether `alg` is one of them.
    pub fn contains(self, alg: Algorithm) -> bool {
        self.0 & Self::bit(alg) != 0
    }

    /// The set of `names` (`RS256`, `PS256`, `ES256`, `EdDSA`, as JOSE
    /// spells them); an error naming the first other one, or for none.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Algorithms, String> {
        let mut bits = 0;
        for name in names {
            let name = name.trim();
            let Some((alg, _)) = NAMED.iter().find(|(_, n)| *n == name) else {
                return Err(format!(
                    "unknown algorithm {name:?}: RS256, PS256, ES256 and EdDSA are accepted"
                ));
            };
            bits |= Self::bit(*alg);
        }
        if bits == 0 {
            return Err("name at least one algorithm: RS256, PS256, ES256, EdDSA".into());
        }
        Ok(Algorithms(bits))
    }

    /// Their names, in the order RS256, PS256, ES256, EdDSA.
    pub fn names(self) -> Vec<&'static str> {
        NAMED
            .iter()
            .filter(|(alg, _)| self.contains(*alg))
            .map(|(_, name)| *name)
            .collect()
    }

    /// The one algorithm an RSA key that names none (no `alg` in the
    /// JWKS) verifies: RS256, or PS256 where the provider does not sign
    /// with RS256. RFC 8725 section 3.1: a key is used with one algorithm;
    /// one key verifying both PKCS#1 v1.5 and PSS signatures would take a
    /// signature made for either as made for this use.
    pub fn unnamed_rsa(self) -> Option<Algorithm> {
        [Algorithm::RS256, Algorithm::PS256]
            .into_iter()
            .find(|alg| self.contains(*alg))
    }
}

/// As their names, a list (audit rows, `oncepay merchant show`).
impl serde::Serialize for Algorithms {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.names())
    }
}

impl Default for Algorithms {
    fn default() -> Algorithms {
        Algorithms::ALL
    }
}

/// A `typ` as RFC 7515 section 4.1.9 compares it: a media type, so
/// case-insensitive, with `application/` implied when it has no `/`.
pub fn media_type(typ: &str) -> String {
    let typ = typ.trim().to_ascii_lowercase();
    if typ.contains('/') {
        typ
    } else {
        format!("application/{typ}")
    }
}

/// Whether a token whose header's `typ` is `typ` (as [`media_type`]
/// reads it; `None`: absent) is one the merchant takes. With a type set
/// (`oncepay merchant identity --token-type at+jwt`, say), only that
/// type, and a token without `typ` is not of it. Without, a sign-in's
/// tokens: no `typ`, `JWT` (ID tokens and most access tokens) or `at+jwt`
/// (RFC 9068 access tokens); a token of any other kind the same provider
/// signs with the same keys (a `logout+jwt` back-channel logout token, a
/// `secevent+jwt` security event, a `dpop+jwt` proof) is refused, so one
/// cannot be replayed as a sign-in (RFC 8725 section 3.11).
pub fn type_accepted(typ: Option<&str>, required: Option<&str>) -> Result<(), Refusal> {
    let accepted = match (typ, required) {
        (Some(typ), Some(required)) => typ == media_type(required),
        (None, Some(_)) => false,
        (None, None) => true,
        (Some(typ), None) => typ == "application/jwt" || typ == "application/at+jwt",
    };
    if accepted {
        Ok(())
    } else {
        Err(Refusal::TokenType)
    }
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
    /// The header's `typ`, as [`media_type`] reads it; `None`: absent.
    pub typ: Option<String>,
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
    let typ = match header.get("typ") {
        None => None,
        Some(Value::String(typ)) => Some(media_type(typ)),
        Some(_) => return Err(Refusal::TokenType),
    };
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
    Ok(Unverified {
        alg,
        kid,
        issuer,
        typ,
    })
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
/// one, the header's; an RSA key that names none verifies one algorithm
/// only, `algorithms`' [`Algorithms::unnamed_rsa`] (EC and OKP keys are
/// bound to one algorithm by their curve).
fn decoding_key(
    key: &PublicKey,
    alg: Algorithm,
    algorithms: Algorithms,
) -> Result<DecodingKey, Refusal> {
    let (kty, crv, name) = needs(alg);
    let unnamed_rsa_fits = kty != "RSA" || algorithms.unnamed_rsa() == Some(alg);
    if key.kty != kty
        || crv.is_some_and(|c| key.crv.as_deref() != Some(c))
        || key.alg.as_deref().is_some_and(|a| a != name)
        || (key.alg.is_none() && !unnamed_rsa_fits)
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
    /// The algorithms the identity provider signs with.
    pub algorithms: Algorithms,
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
    if !expected.algorithms.contains(peeked.alg) {
        return Err(Refusal::AlgorithmNotTrusted);
    }
    let decoding = decoding_key(key, peeked.alg, expected.algorithms)?;
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
        assert!(decoding_key(&ec, Algorithm::ES256, Algorithms::ALL).is_ok());
        assert_eq!(
            decoding_key(&ec, Algorithm::RS256, Algorithms::ALL).err(),
            Some(Refusal::KeyMismatch)
        );
        assert_eq!(
            decoding_key(&ec, Algorithm::EdDSA, Algorithms::ALL).err(),
            Some(Refusal::KeyMismatch)
        );
        let p384 = PublicKey {
            crv: Some("P-384".into()),
            ..ec.clone()
        };
        assert_eq!(
            decoding_key(&p384, Algorithm::ES256, Algorithms::ALL).err(),
            Some(Refusal::KeyMismatch)
        );
        let named = PublicKey {
            alg: Some("ES384".into()),
            ..ec.clone()
        };
        assert_eq!(
            decoding_key(&named, Algorithm::ES256, Algorithms::ALL).err(),
            Some(Refusal::KeyMismatch)
        );
        let short = PublicKey {
            components: vec![x.clone(), "AA".into()],
            ..ec
        };
        assert_eq!(
            decoding_key(&short, Algorithm::ES256, Algorithms::ALL).err(),
            Some(Refusal::BadKey)
        );
        let rsa = PublicKey {
            kty: "RSA".into(),
            alg: Some("RS256".into()),
            crv: None,
            components: vec!["AQAB".into(), "AQAB".into()],
        };
        assert_eq!(
            decoding_key(&rsa, Algorithm::PS256, Algorithms::ALL).err(),
            Some(Refusal::KeyMismatch)
        );
    }

    #[test]
    fn an_rsa_key_naming_no_alg_verifies_one_algorithm() {
        let rsa = PublicKey {
            kty: "RSA".into(),
            alg: None,
            crv: None,
            components: vec!["AQAB".into(), "AQAB".into()],
        };
        let mismatch = |alg, algorithms| decoding_key(&rsa, alg, algorithms).err();
        assert_eq!(
            mismatch(Algorithm::PS256, Algorithms::ALL),
            Some(Refusal::KeyMismatch),
            "RS256 by default, never PS256 as well"
        );
        assert_ne!(
            mismatch(Algorithm::RS256, Algorithms::ALL),
            Some(Refusal::KeyMismatch)
        );
        let pss = Algorithms::parse(["PS256", "ES256"]).expect("algorithms");
        assert_eq!(pss.unnamed_rsa(), Some(Algorithm::PS256));
        assert_ne!(mismatch(Algorithm::PS256, pss), Some(Refusal::KeyMismatch));
        assert_eq!(mismatch(Algorithm::RS256, pss), Some(Refusal::KeyMismatch));
        let ec_only = Algorithms::parse(["ES256"]).expect("algorithms");
        assert_eq!(ec_only.unnamed_rsa(), None);
    }

    #[test]
    fn algorithms_parse_from_their_jose_names() {
        assert_eq!(
            Algorithms::parse(["RS256", "PS256", "ES256", "EdDSA"]),
            Ok(Algorithms::ALL)
        );
        assert_eq!(Algorithms::default(), Algorithms::ALL);
        let two = Algorithms::parse(["EdDSA", " RS256"]).expect("algorithms");
        assert_eq!(two.names(), vec!["RS256", "EdDSA"]);
        assert!(two.contains(Algorithm::EdDSA) && !two.contains(Algorithm::PS256));
        assert!(!Algorithms::ALL.contains(Algorithm::HS256));
        for bad in [vec![], vec!["HS256"], vec!["rs256"], vec!["none"]] {
            assert!(Algorithms::parse(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_token_of_another_kind_is_refused() {
        assert_eq!(media_type("JWT"), "application/jwt");
        assert_eq!(media_type("application/AT+JWT"), "application/at+jwt");
        let ok = |typ: Option<&str>, required| {
            type_accepted(typ.map(media_type).as_deref(), required).is_ok()
        };
        for typ in [
            None,
            Some("JWT"),
            Some("jwt"),
            Some("at+jwt"),
            Some("application/at+jwt"),
        ] {
            assert!(ok(typ, None), "{typ:?}");
        }
        for typ in [
            "logout+jwt",
            "secevent+jwt",
            "dpop+jwt",
            "JOSE",
            "id_token+jwt",
        ] {
            assert!(!ok(Some(typ), None), "{typ}");
        }
        assert!(ok(Some("at+jwt"), Some("at+jwt")));
        assert!(ok(Some("application/at+jwt"), Some("AT+JWT")));
        assert!(!ok(Some("JWT"), Some("at+jwt")));
        assert!(!ok(None, Some("at+jwt")));
        let header = |typ: Value| {
            token(
                serde_json::json!({"alg": "ES256", "kid": "k", "typ": typ}),
                serde_json::json!({"iss": "https://idp"}),
            )
        };
        assert_eq!(
            peek(&header(serde_json::json!("AT+JWT"))).map(|u| u.typ),
            Ok(Some("application/at+jwt".to_string()))
        );
        assert_eq!(peek(&header(serde_json::json!(7))), Err(Refusal::TokenType));
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
