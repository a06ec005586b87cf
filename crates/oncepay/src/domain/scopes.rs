//! What an API key may do: its scopes, stored by name and checked on
//! every request (`http::access`).

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Reads (`GET`).
    Read,
    /// Orders, payments, refunds, cancels, checkout sessions.
    Write,
    /// API keys, webhook endpoints, redelivery, the audit trail.
    Admin,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Write, Scope::Admin];

    /// Its name, as stored and as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }

    /// The scope of a name.
    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == name)
    }

    fn bit(self) -> u8 {
        match self {
            Scope::Read => 1,
            Scope::Write => 2,
            Scope::Admin => 4,
        }
    }
}

/// A key's scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope (what a key made before scopes existed has).
    pub const ALL: Scopes = Scopes(7);

    /// Whether `scope` is among them.
    pub fn has(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Whether every one of them is among `other`.
    pub fn within(self, other: Scopes) -> bool {
        self.0 & !other.0 == 0
    }

    /// The first of them not among `other`.
    pub fn first_outside(self, other: Scopes) -> Option<Scope> {
        Scope::ALL
            .into_iter()
            .find(|s| self.has(*s) && !other.has(*s))
    }

    /// Their names, in a fixed order.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|s| self.has(*s))
            .map(Scope::as_str)
            .collect()
    }

    /// The scopes named, or the first name that is not a scope. At least
    /// one must be named.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Scopes, String> {
        let mut bits = 0;
        for name in names {
            let scope = Scope::parse(name.trim())
                .ok_or_else(|| format!("{name:?} is not a scope (read, write, admin)"))?;
            bits |= scope.bit();
        }
        if bits == 0 {
            return Err("name at least one scope (read, write, admin)".into());
        }
        Ok(Scopes(bits))
    }
}
