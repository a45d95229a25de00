//! Kubernetes resource quantities (`100m`, `0.5`, `128Mi`, `1G`, `1e3`), parsed exactly so
//! they can be compared: the validator checks minimums and requests ≤ limits with them, the
//! defaulting takes the larger of two. Pure.
//!
//! The grammar is apimachinery's `resource.Quantity`: an optionally signed decimal number
//! followed by nothing, a binary-SI suffix (`Ki Mi Gi Ti Pi Ei`), a decimal-SI suffix
//! (`n u m k M G T P E`) or a decimal exponent (`e3`, `E-2`). Values are held in nano-units,
//! rounded up like Kubernetes rounds sub-nano precision.

use std::cmp::Ordering;
use std::fmt;

/// A parsed quantity; ordered by value, displayed as written.
#[derive(Clone, Debug)]
pub struct Quantity {
    text: String,
    nanos: i128,
}

/// What is wrong with a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// It does not follow the grammar.
    #[error(
        "{input:?} is not a quantity (expected a number with an optional suffix, \
         e.g. 100m, 0.5, 128Mi, 1G or 1e3)"
    )]
    Syntax {
        /// The text given.
        input: String,
    },
    /// It is too large (or too precise) to be a resource amount.
    #[error("{input:?} is out of range for a resource quantity")]
    OutOfRange {
        /// The text given.
        input: String,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

const NANO_DIGITS: i32 = 9;
/// Digits of a mantissa kept exactly; more is not a resource amount.
const MAX_DIGITS: usize = 30;

impl Quantity {
    /// Parses `text`.
    ///
    /// # Errors
    /// [`Error::Syntax`] or [`Error::OutOfRange`].
    pub fn parse(text: &str) -> Result<Quantity> {
        let syntax = || Error::Syntax {
            input: text.to_string(),
        };
        let range = || Error::OutOfRange {
            input: text.to_string(),
        };
        let (negative, unsigned) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = unsigned
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(unsigned.len());
        let (number, suffix) = unsigned.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(syntax());
        }
        let (exp10, exp2) = parse_suffix(suffix).ok_or_else(syntax)?;
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DIGITS {
            return Err(range());
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| syntax())?
        };
        let scale = i32::try_from(fraction.len())
            .ok()
            .and_then(|f| (NANO_DIGITS - f).checked_add(exp10))
            .ok_or_else(range)?;
        let nanos = scaled(mantissa, exp2, scale).ok_or_else(range)?;
        Ok(Quantity {
            text: text.to_string(),
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// The quantity as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value in nano-units (rounded up).
    pub fn nanos(&self) -> i128 {
        self.nanos
    }
}

/// `mantissa · 2^exp2 · 10^exp10`, rounded up, or `None` when it overflows.
fn scaled(mantissa: i128, exp2: u32, exp10: i32) -> Option<i128> {
    let value = mantissa.checked_mul(1i128.checked_shl(exp2)?)?;
    if value == 0 {
        return Some(0);
    }
    if exp10 >= 0 {
        value.checked_mul(10i128.checked_pow(exp10.unsigned_abs())?)
    } else {
        // Dividing by more than 10^38 leaves less than one nano-unit: round up to one.
        match 10i128.checked_pow(exp10.unsigned_abs()) {
            Some(divisor) => Some(value.div_euclid(divisor) + i128::from(value % divisor != 0)),
            None => Some(1),
        }
    }
}

/// (decimal exponent, binary exponent) of a suffix.
fn parse_suffix(suffix: &str) -> Option<(i32, u32)> {
    let decimal = |e| Some((e, 0));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => Some((0, 10)),
        "Mi" => Some((0, 20)),
        "Gi" => Some((0, 30)),
        "Ti" => Some((0, 40)),
        "Pi" => Some((0, 50)),
        "Ei" => Some((0, 60)),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            exponent.parse::<i32>().ok().map(|e| (e, 0))
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Quantity) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Quantity) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Quantity) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn every_suffix_family_parses_to_the_same_scale() {
        assert_eq!(q("100m"), q("0.1"));
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1k"), q("1e3"));
        assert_eq!(q("1k"), q("1E3"));
        assert_eq!(q("1M"), q("1000k"));
        assert_eq!(q("16Mi").nanos(), 16 * 1024 * 1024 * 1_000_000_000);
        assert_eq!(q("0.5Gi"), q("512Mi"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("2e-3"), q("2m"));
        assert_eq!(q("+5"), q("5"));
        assert_eq!(q("1n").nanos(), 1);
        assert_eq!(q("1u"), q("1000n"));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("5."), q("5"));
        assert_eq!(q("1Ei").nanos(), (1i128 << 60) * 1_000_000_000);
        assert_eq!(q("-1").nanos(), -1_000_000_000);
        assert_eq!(q("0"), q("0Gi"));
    }

    #[test]
    fn quantities_compare_by_value_and_display_as_written() {
        assert!(q("10m") < q("0.011"));
        assert!(q("128Mi") > q("128M"));
        assert!(q("1Gi") > q("1000Mi"));
        assert_eq!(q("0.1").to_string(), "0.1");
    }

    #[test]
    fn sub_nano_precision_rounds_up() {
        assert_eq!(q("0.1n").nanos(), 1);
        assert_eq!(q("1e-30").nanos(), 1);
        assert_eq!(q("1.5n").nanos(), 2);
    }

    #[test]
    fn malformed_quantities_are_syntax_errors() {
        for bad in [
            "", "abc", "1.2.3", "10 m", "1K", "1mi", "1e", "1e+", "1Mib", "m", ".", "--1", "1e3m",
            "0x10",
        ] {
            let err = Quantity::parse(bad).unwrap_err();
            assert!(matches!(err, Error::Syntax { .. }), "{bad:?}: {err}");
        }
        let msg = Quantity::parse("lots").unwrap_err().to_string();
        assert!(msg.contains("\"lots\" is not a quantity") && msg.contains("128Mi"));
    }

    #[test]
    fn absurdly_large_quantities_are_out_of_range() {
        for big in [
            "1e100",
            "99999999999999999999999999999999999",
            "1e2147483647",
            "1Ei1",
        ] {
            let err = Quantity::parse(big);
            assert!(
                matches!(err, Err(Error::OutOfRange { .. } | Error::Syntax { .. })),
                "{big}: {err:?}"
            );
        }
        assert!(matches!(
            Quantity::parse("1e100").unwrap_err(),
            Error::OutOfRange { .. }
        ));
        assert!(matches!(
            Quantity::parse("1e2147483647").unwrap_err(),
            Error::OutOfRange { .. }
        ));
    }
}
