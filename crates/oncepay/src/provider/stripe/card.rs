//! Stripe's card form: Stripe Elements. Stripe.js mounts the card field in
//! Stripe's frame and makes the PaymentMethod oncepay is given
//! (`assets/card_stripe.js`); the card's numbers never touch the page.

use super::PublishableKey;
use crate::provider::card_form::{escape, CardForm, CardWords, CspSources};

/// The script: loads Stripe.js, mounts Elements, makes the PaymentMethod.
const SCRIPT: &str = include_str!("../../../assets/card_stripe.js");

/// Stripe.js, from Stripe's own origin (never bundled: Stripe requires it
/// be loaded from there, which keeps the card fields in Stripe's frames).
const STRIPE_JS: &str = "https://js.stripe.com/v3/";

/// What the checkout page's Content-Security-Policy allows for Stripe
/// Elements, per Stripe's CSP guide: its script, its frames (the card
/// fields, 3-D Secure), and its API (where the card goes).
const ELEMENTS_CSP: CspSources<'static> = CspSources {
    script: "https://js.stripe.com",
    frame: "https://js.stripe.com https://hooks.stripe.com",
    connect: "https://api.stripe.com",
};

/// Stripe Elements for the account of a publishable key.
pub(crate) struct Elements {
    publishable_key: PublishableKey,
}

impl Elements {
    /// Elements for the account whose publishable key this is.
    pub(crate) fn new(publishable_key: PublishableKey) -> Elements {
        Elements { publishable_key }
    }
}

impl CardForm for Elements {
    fn kind(&self) -> &'static str {
        "stripe"
    }

    // Stripe's frame carries the autocomplete attributes of its own
    // inputs; the page holds only the place it mounts in.
    fn fields(&self, words: &CardWords) -> String {
        format!(
            "<div class=\"field\"><p class=\"label\" id=\"card-element-label\">{}</p>\n\
             <div id=\"card-element\" class=\"card-element\" role=\"group\" aria-labelledby=\"card-element-label\" \
             aria-describedby=\"card-element-error\"></div>\n\
             <p class=\"field-error\" id=\"card-element-error\" hidden></p></div>\n",
            escape(words.card)
        )
    }

    fn data(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("stripe-key", &self.publishable_key.0),
            ("stripe-js", STRIPE_JS),
        ]
    }

    fn script(&self) -> &'static str {
        SCRIPT
    }

    fn csp(&self) -> CspSources<'_> {
        ELEMENTS_CSP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_name_the_key_and_stripe_js_and_mount_in_card_element() {
        let form = Elements::new(PublishableKey("pk_test_oncepay".into()));
        assert_eq!(
            form.data(),
            [
                ("stripe-key", "pk_test_oncepay"),
                ("stripe-js", "https://js.stripe.com/v3/")
            ]
        );
        let words = CardWords {
            card_number: "",
            card: "Card",
            expiry: "",
            expiry_hint: "",
            cvc: "",
        };
        assert!(form.fields(&words).contains("id=\"card-element\""));
        assert!(SCRIPT.contains("window.oncepayCard"));
    }
}
