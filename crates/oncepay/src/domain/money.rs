//! Amounts and currencies: the two values every money command carries, parsed
//! once at the edge so that the rest of the code cannot hold an invalid one.

use std::fmt;

/// The largest amount accepted anywhere, in minor units (contract section 2).
pub(crate) const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// A positive amount in minor units, `1 ..= 10^12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(i64);

/// An amount outside `1 ..= 10^12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be an integer from 1 to 1000000000000 (minor units)")]
pub struct AmountOutOfRange;

impl Amount {
    /// The value in minor units.
    pub fn minor_units(self) -> i64 {
        self.0
    }
}

impl TryFrom<i128> for Amount {
    type Error = AmountOutOfRange;

    fn try_from(value: i128) -> Result<Self, Self::Error> {
        if (1..=MAX_AMOUNT as i128).contains(&value) {
            Ok(Amount(value as i64))
        } else {
            Err(AmountOutOfRange)
        }
    }
}

impl TryFrom<i64> for Amount {
    type Error = AmountOutOfRange;

    fn try_from(value: i64) -> Result<Self, Self::Error> {
        Amount::try_from(value as i128)
    }
}

/// An ISO 4217 code of a circulating currency, upper case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency([u8; 3]);

/// Not an upper-case ISO 4217 code of a circulating currency.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be an upper-case ISO 4217 currency code, such as USD or EUR")]
pub struct UnknownCurrency;

/// Circulating ISO 4217 currencies. Fund codes, precious metals and testing
/// codes (XAU, XTS, XXX, ...) are left out: nobody pays an order in them.
const ISO_4217: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT",
    "BGN", "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD",
    "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD",
    "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ",
    "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD", "JOD",
    "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP", "LKR",
    "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR",
    "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN",
    "PGK", "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR",
    "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB",
    "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU", "UZS",
    "VED", "VES", "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR", "ZMW",
    "ZWG",
];

impl Currency {
    /// Every currency oncepay accepts.
    pub fn all() -> impl Iterator<Item = Currency> {
        ISO_4217.iter().filter_map(|c| Currency::try_from(*c).ok())
    }

    /// The three-letter code.
    pub fn as_str(&self) -> &str {
        // Only ASCII codes from ISO_4217 are ever constructed.
        std::str::from_utf8(&self.0).unwrap_or("XXX")
    }
}

/// Currencies whose minor unit is not a hundredth (ISO 4217's exponent):
/// none for these…
const NO_MINOR_UNIT: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
];
/// …and a thousandth for these.
const THOUSANDTHS: &[&str] = &["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];

impl Currency {
    /// How many decimals its minor unit has (ISO 4217's exponent).
    pub fn exponent(&self) -> u32 {
        if NO_MINOR_UNIT.contains(&self.as_str()) {
            0
        } else if THOUSANDTHS.contains(&self.as_str()) {
            3
        } else {
            2
        }
    }

    /// `amount` minor units written for people: `25.00 EUR`, `2500 JPY`,
    /// `1.250 KWD`, with thousands grouped by a thin space.
    pub fn format(&self, amount: i64) -> String {
        let scale = 10i64.pow(self.exponent());
        let (whole, fraction) = (amount / scale, (amount % scale).abs());
        let digits = whole.abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push('\u{202f}');
            }
            grouped.push(c);
        }
        let sign = if amount < 0 { "-" } else { "" };
        match self.exponent() {
            0 => format!("{sign}{grouped} {self}"),
            e => format!(
                "{sign}{grouped}.{fraction:0width$} {self}",
                width = e as usize
            ),
        }
    }
}

impl TryFrom<&str> for Currency {
    type Error = UnknownCurrency;

    fn try_from(code: &str) -> Result<Self, Self::Error> {
        if ISO_4217.binary_search(&code).is_ok() {
            let b = code.as_bytes();
            Ok(Currency([b[0], b[1], b[2]]))
        } else {
            Err(UnknownCurrency)
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_written_in_the_currency_s_minor_units() {
        let c = |code: &str| Currency::try_from(code).expect("known");
        assert_eq!(c("EUR").format(2500), "25.00 EUR");
        assert_eq!(c("EUR").format(5), "0.05 EUR");
        assert_eq!(
            c("USD").format(123_456_789),
            "1\u{202f}234\u{202f}567.89 USD"
        );
        assert_eq!(c("JPY").format(2500), "2\u{202f}500 JPY");
        assert_eq!(c("KWD").format(1250), "1.250 KWD");
        for code in NO_MINOR_UNIT.iter().chain(THOUSANDTHS) {
            assert!(ISO_4217.contains(code), "{code} is a circulating currency");
        }
    }

    #[test]
    fn the_currency_table_is_sorted_for_binary_search() {
        assert!(ISO_4217.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn currencies_are_upper_case_iso_codes() {
        assert_eq!(
            Currency::try_from("EUR").map(|c| c.to_string()),
            Ok("EUR".into())
        );
        assert!(Currency::try_from("usd").is_err());
        assert!(Currency::try_from("ABC").is_err());
        assert!(Currency::try_from("XAU").is_err());
        assert!(Currency::try_from("").is_err());
        assert!(Currency::try_from("EURO").is_err());
    }

    #[test]
    fn amounts_are_bounded() {
        assert!(Amount::try_from(0i64).is_err());
        assert!(Amount::try_from(-5i64).is_err());
        assert_eq!(Amount::try_from(1i64).map(Amount::minor_units), Ok(1));
        assert!(Amount::try_from(MAX_AMOUNT).is_ok());
        assert!(Amount::try_from(MAX_AMOUNT + 1).is_err());
        assert!(Amount::try_from(i128::MAX).is_err());
    }
}
