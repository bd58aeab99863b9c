//! Kubernetes quantities (`500m`, `8Gi`, `1e3`) as numbers: the one parser of the workspace.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The value of a Kubernetes quantity text, or `None` when it is not one.
///
/// Every form of Kubernetes' grammar: an optionally signed decimal number (`4`, `-1`, `+.5`,
/// `1.`, `1.5`), then one suffix: none, a decimal SI suffix (`n`, `u`, `m`, `k`, `M`, `G`, `T`,
/// `P`, `E`), a binary SI suffix (`Ki` … `Ei`), or a decimal exponent (`e3`, `E-2`, `e+6`; `E`
/// alone is exa). Surrounding whitespace is ignored. Anything else (`lots`, `1Zi`, `1e`,
/// `1e3Ki`, `1e-3m`, `1e1.5`) is not a quantity.
///
/// ```
/// use slinky_api::quantity::parse;
/// assert_eq!(parse("500m"), Some(0.5));
/// assert_eq!(parse("8Gi"), Some(8.0 * 1024.0 * 1024.0 * 1024.0));
/// assert_eq!(parse("1e3"), Some(1000.0));
/// assert_eq!(parse("2E"), Some(2e18));
/// assert_eq!(parse("1Zi"), None);
/// ```
pub fn parse(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, suffix) = split_number(text)?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => return is_exponent(exponent).then(|| text.parse().ok()).flatten(),
    };
    let number: f64 = number.parse().ok()?;
    Some(number * factor)
}

/// Whether `suffix` is a decimal exponent: `e` or `E`, then a signed integer. (The quantity is
/// then parsed as one number, so `1.5e-3` is the nearest f64 to 0.0015.)
fn is_exponent(suffix: &str) -> bool {
    let Some(exponent) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The value of `quantity` (see [`parse`]).
pub fn value(quantity: &Quantity) -> Option<f64> {
    parse(&quantity.0)
}

/// The signed number at the start of `text` (at least one digit, at most one dot) and the rest.
fn split_number(text: &str) -> Option<(&str, &str)> {
    let bytes = text.as_bytes();
    let mut end = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    let (mut digits, mut dot) = (0, false);
    while let Some(&b) = bytes.get(end) {
        match b {
            b'0'..=b'9' => digits += 1,
            b'.' if !dot => dot = true,
            _ => break,
        }
        end += 1;
    }
    (digits > 0).then(|| text.split_at(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_signed_numbers() {
        assert_eq!(parse("4"), Some(4.0));
        assert_eq!(parse(" 4 "), Some(4.0));
        assert_eq!(parse("-1"), Some(-1.0));
        assert_eq!(parse("+.5"), Some(0.5));
        assert_eq!(parse("1."), Some(1.0));
        assert_eq!(parse("1.5"), Some(1.5));
    }

    #[test]
    fn decimal_and_binary_suffixes() {
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("100n"), Some(100.0 * 1e-9));
        assert_eq!(parse("3u"), Some(3.0 * 1e-6));
        assert_eq!(parse("2k"), Some(2000.0));
        assert_eq!(parse("2E"), Some(2e18));
        assert_eq!(parse("8Gi"), Some(8.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse("1.5Gi"), Some(1.5 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse("4096Mi"), parse("4Gi"));
        assert_eq!(parse("1Ei"), Some(1024f64.powi(6)));
    }

    #[test]
    fn exponents() {
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse("2e3"), Some(2000.0));
        assert_eq!(parse("1E+2"), Some(100.0));
        assert_eq!(parse("1e-3"), Some(0.001));
        assert_eq!(parse("1.5e-3"), Some(0.0015));
        assert_eq!(parse("-2e2"), Some(-200.0));
    }

    #[test]
    fn not_quantities() {
        for text in [
            "", ".", "-", "lots", "abc", "1Zi", "1e", "1e+", "1e3Ki", "1e-3m", "1e1.5", "1.2.3", "1 Gi",
            "Gi", "inf", "NaN", "0x10", "1ki", "1mi",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn quantity_values() {
        assert_eq!(value(&Quantity("250m".into())), Some(0.25));
    }
}
