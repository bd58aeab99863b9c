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

/// How a quantity was written, which decides its canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// `Ki` … `Ei`.
    BinarySi,
    /// No suffix, or `n` … `E`.
    DecimalSi,
    /// `e3`, `E-2`.
    DecimalExponent,
}

const NANO: i128 = 1_000_000_000;

/// The exact value of a quantity text in nano-units (rounded up to a nano-unit, as Kubernetes
/// parses it) and its format; `None` when it is not a quantity or is beyond ±10^27.
fn exact(text: &str) -> Option<(i128, Format)> {
    let text = text.trim();
    let (number, suffix) = split_number(text)?;
    let (ten, two, format) = match suffix {
        "" => (0, 0, Format::DecimalSi),
        "n" => (-9, 0, Format::DecimalSi),
        "u" => (-6, 0, Format::DecimalSi),
        "m" => (-3, 0, Format::DecimalSi),
        "k" => (3, 0, Format::DecimalSi),
        "M" => (6, 0, Format::DecimalSi),
        "G" => (9, 0, Format::DecimalSi),
        "T" => (12, 0, Format::DecimalSi),
        "P" => (15, 0, Format::DecimalSi),
        "E" => (18, 0, Format::DecimalSi),
        "Ki" => (0, 10, Format::BinarySi),
        "Mi" => (0, 20, Format::BinarySi),
        "Gi" => (0, 30, Format::BinarySi),
        "Ti" => (0, 40, Format::BinarySi),
        "Pi" => (0, 50, Format::BinarySi),
        "Ei" => (0, 60, Format::BinarySi),
        e if is_exponent(e) => (e[1..].parse::<i32>().ok()?, 0, Format::DecimalExponent),
        _ => return None,
    };
    let negative = number.starts_with('-');
    let digits = number.trim_start_matches(['+', '-']);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let mut mantissa: i128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    // value = mantissa × 10^(ten - fraction digits) × 2^two, in nano-units: × 10^9.
    let scale = ten
        .checked_add(9)?
        .checked_sub(i32::try_from(fraction.len()).ok()?)?;
    let mut nanos = mantissa.checked_mul(1i128.checked_shl(two)?)?;
    if scale >= 0 {
        nanos = nanos.checked_mul(10i128.checked_pow(scale.unsigned_abs())?)?;
    } else {
        let divisor = 10i128.checked_pow(scale.unsigned_abs())?;
        nanos = nanos.div_euclid(divisor) + i128::from(nanos.rem_euclid(divisor) != 0);
    }
    if nanos.abs() > 10i128.pow(36) {
        return None;
    }
    Some((if negative { -nanos } else { nanos }, format))
}

/// Whether two texts are the same quantity (`1024Mi` and `1Gi`, `1000m` and `1`), exactly.
/// Texts that are not both quantities are the same only when equal.
///
/// ```
/// use slinky_api::quantity::same;
/// assert!(same("1024Mi", "1Gi"));
/// assert!(same("1.5", "1500m"));
/// assert!(!same("1Gi", "1G"));
/// ```
pub fn same(a: &str, b: &str) -> bool {
    a == b
        || match (exact(a), exact(b)) {
            (Some((x, _)), Some((y, _))) => x == y,
            _ => false,
        }
}

/// The canonical form the API server stores a quantity in (`1024Mi` as `1Gi`, `1.5` as `1500m`,
/// `1000m` as `1`, `0.5Gi` as `512Mi`), as Kubernetes' `Quantity.CanonicalizeBytes` writes it;
/// `None` when `text` is not a quantity.
///
/// ```
/// use slinky_api::quantity::canonical;
/// assert_eq!(canonical("1024Mi").as_deref(), Some("1Gi"));
/// assert_eq!(canonical("1.5").as_deref(), Some("1500m"));
/// assert_eq!(canonical("1e3").as_deref(), Some("1e3"));
/// ```
pub fn canonical(text: &str) -> Option<String> {
    let (nanos, mut format) = exact(text)?;
    if nanos == 0 {
        return Some("0".into());
    }
    if format == Format::BinarySi && (nanos.abs() < 1024 * NANO || nanos % NANO != 0) {
        // Small or fractional binary quantities are written in decimal (no rounding).
        format = Format::DecimalSi;
    }
    if format == Format::BinarySi {
        let mut v = nanos / NANO;
        let mut power = 0;
        while power < 6 && v % 1024 == 0 {
            v /= 1024;
            power += 1;
        }
        let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
        return Some(format!("{v}{suffix}"));
    }
    let (mut m, mut exp) = (nanos, -9i32);
    while m % 10 == 0 {
        m /= 10;
        exp += 1;
    }
    let down = exp.rem_euclid(3);
    m *= 10i128.pow(down.unsigned_abs());
    exp -= down;
    let suffix = match format {
        Format::DecimalExponent if exp == 0 => String::new(),
        Format::DecimalExponent => format!("e{exp}"),
        _ => {
            if exp > 18 {
                m *= 10i128.pow((exp - 18).unsigned_abs());
                exp = 18;
            }
            match exp {
                -9 => "n",
                -6 => "u",
                -3 => "m",
                3 => "k",
                6 => "M",
                9 => "G",
                12 => "T",
                15 => "P",
                18 => "E",
                _ => "",
            }
            .to_string()
        }
    };
    Some(format!("{m}{suffix}"))
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
    fn canonical_forms_are_kube_apiservers() {
        // Each pair as kube-apiserver v1.28.7 stores it.
        for (text, want) in [
            ("1024Mi", "1Gi"),
            ("2048Mi", "2Gi"),
            ("1536Mi", "1536Mi"),
            ("0.5Gi", "512Mi"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("100m", "100m"),
            ("0.1", "100m"),
            ("1e3", "1e3"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("4096", "4096"),
            ("512Ki", "512Ki"),
            ("1023Ki", "1023Ki"),
            ("100Mi", "100Mi"),
            ("1Ki", "1Ki"),
            ("0.5Ki", "512"),
            ("0", "0"),
            ("0Gi", "0"),
            ("2E", "2E"),
            ("1G", "1G"),
            ("8Gi", "8Gi"),
            ("1.5Gi", "1536Mi"),
        ] {
            assert_eq!(canonical(text).as_deref(), Some(want), "{text}");
        }
        assert_eq!(canonical("lots"), None);
        // Beyond what the exact form holds: no answer, never a panic.
        assert_eq!(canonical("1e2147483647"), None);
        assert_eq!(canonical("1e-2147483648"), None);
        assert_eq!(canonical("99999999999999999999999999999999999999999Ei"), None);
        assert!(!same("1e2147483647", "1e2147483647x"));
    }

    #[test]
    fn the_same_quantity_in_other_words() {
        assert!(same("1024Mi", "1Gi"));
        assert!(same("4096Mi", "4Gi"));
        assert!(same("1000m", "1"));
        assert!(same("0.5", "500m"));
        assert!(!same("1Gi", "1G"));
        assert!(!same("1", "1.000000001"));
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
    }

    #[test]
    fn quantity_values() {
        assert_eq!(value(&Quantity("250m".into())), Some(0.25));
    }
}
