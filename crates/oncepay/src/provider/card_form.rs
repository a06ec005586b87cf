//! The seam between the hosted checkout page and a provider's card form.
//! The page is the same for every provider (order, amounts, the test
//! field, the Pay button, the payment's protocol); how the card is
//! collected and turned into a payment method is the adapter's: its
//! fields, the attributes its script reads, its script and what the
//! page's Content-Security-Policy must allow for it. A provider whose card
//! form is new touches its adapter and its script, not the page.
//!
//! The browser side mirrors it: the page's script (`assets/checkout.js`)
//! runs after the card form's (`assets/card_<provider>.js`), which sets
//! `window.oncepayCard` to a function taking what the page shares
//! (`{form, T, lang, fieldError, timed}`) and returning
//! `{fields, check(), token(checked)}`, or `null` where its fields are not
//! on the page. `check` reads the fields (`null`, with the errors shown,
//! if one is wrong); `token` sends the card to the provider and resolves
//! to the payment-method id oncepay is given, or rejects with an `Error`
//! whose message the page shows.

use serde::Serialize;

/// A provider's card form on the checkout page
/// ([`PaymentProvider::card_form`](super::PaymentProvider::card_form)).
pub trait CardForm: Send + Sync {
    /// The page's `data-card`: which way the card goes (`tokenize`,
    /// `stripe`); `none` is the page's own word for no card form.
    fn kind(&self) -> &'static str;
    /// The form's fields in the page's words: markup placed in the page's
    /// `<form>`, before the test field and the Pay button. Whatever came
    /// from outside the adapter goes through [`escape`].
    fn fields(&self, words: &CardWords) -> String;
    /// What its script reads on the page's `<form>`: `data-{name}`
    /// attributes (`name` in lower case, `a-z` and `-`), values unescaped.
    fn data(&self) -> Vec<(&'static str, &str)>;
    /// Its script, served at `/checkout/assets/card_{provider}.js` with the
    /// page's own caching and loaded before the page's script.
    fn script(&self) -> &'static str;
    /// What the page's Content-Security-Policy allows for it, beyond the
    /// page's own origin.
    fn csp(&self) -> CspSources<'_>;
}

/// Origins a card form needs in the checkout page's Content-Security-Policy,
/// beyond the page's own; each a space-separated list, empty for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CspSources<'a> {
    /// `script-src`.
    pub script: &'a str,
    /// `frame-src`.
    pub frame: &'a str,
    /// `connect-src`.
    pub connect: &'a str,
}

/// The words a card form's markup may show, in the page's language. They
/// live in the page's table (`http::checkout_text`, every language it
/// speaks), which also hands them to the scripts (`data-text`), so a form
/// and the page never speak two languages.
#[derive(Debug, Serialize)]
pub struct CardWords {
    /// The card number's label.
    pub card_number: &'static str,
    /// The label of a card field that is one box (Stripe Elements).
    pub card: &'static str,
    /// The expiry date's label.
    pub expiry: &'static str,
    /// How the expiry date is written (`MM/YY`).
    pub expiry_hint: &'static str,
    /// The security code's label.
    pub cvc: &'static str,
}

/// Text for HTML text and attribute values: the page's own and every card
/// form's.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A labelled input of the page's own, with the place of its error tied to
/// it (`aria-describedby`), as the page's script reports field errors:
/// `attrs` is the adapter's own markup (name, `autocomplete`, …).
pub fn input_field(id: &str, label: &str, attrs: &str) -> String {
    format!(
        "<div class=\"field\"><label for=\"{id}\">{}</label>\n<input id=\"{id}\" {attrs} aria-describedby=\"{id}-error\">\n\
         <p class=\"field-error\" id=\"{id}-error\" hidden></p></div>\n",
        escape(label)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_escapes_its_label_and_ties_its_error_to_it() {
        let html = input_field("card-cvc", "Code <\"CVC\">", "name=\"cvc\"");
        assert!(html.contains("<label for=\"card-cvc\">Code &lt;&quot;CVC&quot;&gt;</label>"));
        assert!(html
            .contains("<input id=\"card-cvc\" name=\"cvc\" aria-describedby=\"card-cvc-error\">"));
        assert!(html.contains("id=\"card-cvc-error\" hidden"));
        assert_eq!(escape("a&'b"), "a&amp;&#39;b");
    }
}
