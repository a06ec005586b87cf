//! Card numbers, only so as to refuse them: a card number goes from the
//! customer's browser to the provider's tokenization, never to oncepay
//! (which then stays out of PCI DSS scope). The sandbox's tokenization uses
//! the same checks. No I/O here.

/// The digits of `text` if it is written as a card number: 12 to 19
/// digits, optionally grouped by spaces or dashes.
fn digits(text: &str) -> Option<Vec<u8>> {
    let mut digits = Vec::with_capacity(19);
    for c in text.chars() {
        match c {
            '0'..='9' => digits.push(c as u8 - b'0'),
            ' ' | '-' => {}
            _ => return None,
        }
    }
    (12..=19).contains(&digits.len()).then_some(digits)
}

/// Whether the digits pass the Luhn check every card number passes.
fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(*d);
            if i % 2 == 1 {
                let twice = d * 2;
                if twice > 9 {
                    twice - 9
                } else {
                    twice
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// Whether `text` is (very likely) a card number: 12–19 digits, grouped or
/// not, passing the Luhn check.
pub(crate) fn looks_like_card_number(text: &str) -> bool {
    digits(text).is_some_and(|d| luhn(&d))
}

/// A valid card number's digits as a string, and its brand; `None` if it
/// is not one.
pub(crate) fn read_number(text: &str) -> Option<(String, &'static str)> {
    let d = digits(text).filter(|d| luhn(d))?;
    let number: String = d.iter().map(|d| char::from(b'0' + d)).collect();
    Some((number.clone(), brand(&number)))
}

/// The brand by the number's leading digits.
pub fn brand(number: &str) -> &'static str {
    let two: u32 = number.get(..2).and_then(|p| p.parse().ok()).unwrap_or(0);
    let four: u32 = number.get(..4).and_then(|p| p.parse().ok()).unwrap_or(0);
    match () {
        _ if number.starts_with('4') => "visa",
        _ if (51..=55).contains(&two) || (2221..=2720).contains(&four) => "mastercard",
        _ if two == 34 || two == 37 => "amex",
        _ if number.starts_with("6011") || number.starts_with("65") => "discover",
        _ if (3528..=3589).contains(&four) => "jcb",
        _ if number.starts_with("62") => "unionpay",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_numbers_are_recognised_however_they_are_typed() {
        for n in [
            "4242424242424242",
            "4242 4242 4242 4242",
            "4000-0000-0000-0002",
            "4000002760003184",
            "5555555555554444",
            "378282246310005",
        ] {
            assert!(looks_like_card_number(n), "{n}");
        }
        for n in [
            "4242424242424241",
            "tok_visa",
            "pm_card_visa",
            "12345",
            "4242x4242424242424",
        ] {
            assert!(!looks_like_card_number(n), "{n}");
        }
    }

    #[test]
    fn brands() {
        assert_eq!(read_number("4242 4242 4242 4242").unwrap().1, "visa");
        assert_eq!(read_number("5555555555554444").unwrap().1, "mastercard");
        assert_eq!(read_number("378282246310005").unwrap().1, "amex");
        assert_eq!(read_number("6011111111111117").unwrap().1, "discover");
        assert_eq!(read_number("4242424242424241"), None);
    }
}
