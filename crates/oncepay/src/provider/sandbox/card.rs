//! The sandbox's card form: the page's own fields, which the customer's
//! browser posts to the sandbox's `POST /v1/tokens` (Stripe's form
//! fields), sending oncepay only the `tok_…` it answers
//! (`assets/card_sandbox.js`).

use crate::provider::card_form::{input_field, CardForm, CardWords, CspSources};

/// The script: formats and checks the fields, tokenizes the card.
const SCRIPT: &str = include_str!("../../../assets/card_sandbox.js");

/// Card number, expiry and CVC, tokenized at the sandbox.
pub(crate) struct TokenizedCard {
    /// `POST /v1/tokens` as customers' browsers reach it.
    tokens_url: String,
    /// Its origin, the only one besides the page's the card goes to.
    tokens_origin: String,
}

impl TokenizedCard {
    /// The form posting to `tokens_url`.
    pub(crate) fn new(tokens_url: String) -> TokenizedCard {
        // An unparseable URL allows nothing more: the card then goes
        // nowhere rather than anywhere.
        let tokens_origin = reqwest::Url::parse(&tokens_url)
            .ok()
            .map(|u| u.origin().ascii_serialization())
            .filter(|o| o != "null")
            .unwrap_or_default();
        TokenizedCard {
            tokens_url,
            tokens_origin,
        }
    }
}

impl CardForm for TokenizedCard {
    fn kind(&self) -> &'static str {
        "tokenize"
    }

    fn fields(&self, words: &CardWords) -> String {
        format!(
            "{}<div class=\"row\">{}{}</div>\n",
            input_field(
                "card-number",
                words.card_number,
                "name=\"cardnumber\" inputmode=\"numeric\" autocomplete=\"cc-number\" placeholder=\"1234 1234 1234 1234\" maxlength=\"23\""
            ),
            input_field(
                "card-exp",
                &format!("{} ({})", words.expiry, words.expiry_hint),
                "name=\"exp-date\" inputmode=\"numeric\" autocomplete=\"cc-exp\" placeholder=\"MM/YY\" maxlength=\"7\""
            ),
            input_field(
                "card-cvc",
                words.cvc,
                "name=\"cvc\" inputmode=\"numeric\" autocomplete=\"cc-csc\" maxlength=\"4\""
            ),
        )
    }

    fn data(&self) -> Vec<(&'static str, &str)> {
        vec![("tokenize", &self.tokens_url)]
    }

    fn script(&self) -> &'static str {
        SCRIPT
    }

    fn csp(&self) -> CspSources<'_> {
        CspSources {
            connect: &self.tokens_origin,
            ..CspSources::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_goes_to_the_tokens_origin_only() {
        let form = TokenizedCard::new("http://127.0.0.1:4010/v1/tokens".into());
        assert_eq!(
            form.csp(),
            CspSources {
                connect: "http://127.0.0.1:4010",
                ..CspSources::default()
            }
        );
        assert_eq!(
            form.data(),
            [("tokenize", "http://127.0.0.1:4010/v1/tokens")]
        );
        assert_eq!(
            TokenizedCard::new("not a url".into()).csp(),
            CspSources::default()
        );
        assert!(SCRIPT.contains("window.oncepayCard"));
    }
}
