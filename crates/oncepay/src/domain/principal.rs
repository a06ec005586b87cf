//! Who a request speaks for when it carries a token of the merchant's own
//! identity provider: the role its roles claim grants, and what each role
//! may do. No I/O here.

use serde_json::Value;

use super::scopes::{Scope, Scopes};

/// The role a token acts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A shop's customer: its `sub` is the customer id, and it acts only
    /// on its own orders and payments (`http::routes::Customers`).
    Customer,
    /// The shop's staff: what a key with the `read` and `write` scopes may
    /// do, never `admin`.
    Seller,
}

impl Role {
    /// Its name, in the roles claim, in the audit trail and in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Customer => "customer",
            Role::Seller => "seller",
        }
    }

    /// The role a roles claim (a string or an array of strings) grants.
    /// Holding both, a token gets the lesser (`customer`): no token is
    /// trusted with more than one reading of it allows. Other roles
    /// (`admin` among them) grant nothing here.
    pub fn of_claim(claim: Option<&Value>) -> Option<Role> {
        let names: Vec<&str> = match claim {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if names.contains(&"customer") {
            Some(Role::Customer)
        } else if names.contains(&"seller") {
            Some(Role::Seller)
        } else {
            None
        }
    }

    /// The scopes a token of this role holds, as a key's are checked.
    /// A customer's are further narrowed route by route to what it owns.
    pub fn scopes(self) -> Scopes {
        Scopes::parse([Scope::Read.as_str(), Scope::Write.as_str()]).unwrap_or_default()
    }
}

/// The longest customer id (`customer_id` of an order), in characters: a
/// customer token's `sub` must be one.
pub const MAX_CUSTOMER_ID_CHARS: usize = 64;

/// Whether `sub` can be a customer id: 1 to 64 characters, none of them
/// U+0000 (which PostgreSQL cannot store).
pub fn is_customer_id(sub: &str) -> bool {
    !sub.is_empty() && sub.chars().count() <= MAX_CUSTOMER_ID_CHARS && !sub.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_come_from_a_string_or_an_array_and_the_lesser_wins() {
        assert_eq!(
            Role::of_claim(Some(&json!("customer"))),
            Some(Role::Customer)
        );
        assert_eq!(Role::of_claim(Some(&json!(["seller"]))), Some(Role::Seller));
        assert_eq!(
            Role::of_claim(Some(&json!(["seller", "customer"]))),
            Some(Role::Customer)
        );
        assert_eq!(Role::of_claim(Some(&json!(["admin"]))), None);
        assert_eq!(Role::of_claim(Some(&json!("admin seller"))), None);
        assert_eq!(Role::of_claim(Some(&json!(7))), None);
        assert_eq!(Role::of_claim(None), None);
    }

    #[test]
    fn no_role_holds_admin() {
        for role in [Role::Customer, Role::Seller] {
            assert!(!role.scopes().has(Scope::Admin), "{role:?}");
            assert!(role.scopes().has(Scope::Read) && role.scopes().has(Scope::Write));
        }
    }

    #[test]
    fn a_customer_id_is_what_an_order_can_hold() {
        assert!(is_customer_id("cus_42"));
        assert!(is_customer_id(&"é".repeat(64)));
        assert!(!is_customer_id(&"é".repeat(65)));
        assert!(!is_customer_id(""));
        assert!(!is_customer_id("a\0b"));
    }
}
