//! Sizes (`4KiB`, `64MiB`, `1GiB`, `1.5MB`, plain bytes) and durations (`5s`, `250ms`, `2m`,
//! plain seconds) on the command line.

use std::time::Duration;

/// Parses a byte size: a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB;
/// case-insensitive, `K`/`M`/`G` meaning binary units).
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (number, unit) = number_and_unit(text);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, 4KiB, 64MiB, 1GiB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ));
        }
    };
    let bytes = (number * scale).round();
    if !bytes.is_finite() || bytes < 0.0 || bytes > (1u64 << 50) as f64 {
        return Err(format!("{text:?} is out of range (at most 1 PiB)"));
    }
    // In range (checked above): the conversion is exact for whole numbers of this size.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as usize)
}

/// `text` split where its number (digits and dots) ends.
fn number_and_unit(text: &str) -> (&str, &str) {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    text.split_at(split)
}

/// Parses a duration: a number with an optional unit (`ns`, `us`, `ms`, `s`, `m`, `h`; plain
/// numbers are seconds).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = number_and_unit(text);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 5s, 250ms, 2m)"))?;
    let seconds = number
        * match unit.trim() {
            "" | "s" => 1.0,
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(format!(
                    "unknown duration unit {other:?} in {text:?} (ns, us, ms, s, m, h)"
                ));
            }
        };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses a percentage: `0.1%` or `0.1`, from 0 to 100.
pub(crate) fn parse_percent(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let number = text.strip_suffix('%').unwrap_or(text).trim();
    match number.parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!(
            "{text:?} is not a percentage from 0 to 100 (e.g. 0.1%)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_take_an_optional_sign_and_stay_in_range() {
        assert_eq!(parse_percent("0.1%"), Ok(0.1));
        assert_eq!(parse_percent(" 1 "), Ok(1.0));
        assert!(parse_percent("101%").is_err());
        assert!(parse_percent("-1").is_err());
        assert!(parse_percent("lots").is_err());
    }

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(parse_size("MiB").unwrap_err().contains("not a size"));
        assert!(parse_size("9999TiB").unwrap_err().contains("out of range"));
    }

    #[test]
    fn durations_parse_with_units_and_plain_seconds() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(
            parse_duration("3 fortnights")
                .unwrap_err()
                .contains("unknown duration unit")
        );
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
    }
}
