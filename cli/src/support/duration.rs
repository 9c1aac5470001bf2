//! Durations on the command line (`500ms`, `30s`, `2m`, `1h`) and on screen.

use std::time::Duration;

/// Parses a number followed by `us`, `ms`, `s`, `m` or `h`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!("'{text}' is not a duration, expected a number and a unit like 500ms, 30s, 2m")
    })?;
    let seconds = match unit {
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "'{text}' has unit '{unit}', expected one of us, ms, s, m, h"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("'{text}': {e}"))
}

/// A short human form: `850ms`, `1.25s`, `3m20s`.
pub fn show(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 1.0 {
        format!("{:.0}us", ms * 1e3)
    } else if ms < 1000.0 {
        format!("{ms:.0}ms")
    } else if d.as_secs() < 120 {
        format!("{:.2}s", d.as_secs_f64())
    } else {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

/// [`show`] for a number of seconds (negative or not a number: `0s`).
pub fn age(seconds: f64) -> String {
    show(Duration::try_from_secs_f64(seconds).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse("30").unwrap_err().contains("unit ''"));
        assert!(parse("fast").is_err());
    }

    #[test]
    fn shows_read_well() {
        assert_eq!(show(Duration::from_millis(850)), "850ms");
        assert_eq!(show(Duration::from_millis(1250)), "1.25s");
        assert_eq!(show(Duration::from_secs(200)), "3m20s");
    }
}
