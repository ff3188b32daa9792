//! Host clocks, for the provider's programs whose verdicts use the API server's time instead
//! (the reaper, the gateway's records): a test's offset for the host's clock, and the offset
//! between a server-stamped time and the host's.

use jiff::{SignedDuration, Timestamp};

/// Parses an offset like `+6h`, `-90m` or `0s` (the hidden `--host-clock-offset` of the reaper
/// and the gateway: a test pretends the host's clock is off by that much).
pub fn parse_offset(text: &str) -> Result<SignedDuration, String> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let unsigned = humantime::parse_duration(rest)
        .map_err(|e| format!("{text:?} is not an offset like +6h or -90m: {e}"))?;
    let magnitude = SignedDuration::try_from(unsigned).map_err(|e| format!("{text:?}: {e}"))?;
    Ok(if negative { -magnitude } else { magnitude })
}

/// The host's clock, moved by `offset` (zero outside tests); the host's own time if that would
/// leave jiff's range.
pub fn host_now(offset: SignedDuration) -> Timestamp {
    let now = Timestamp::now();
    now.checked_add(offset).unwrap_or(now)
}

/// How far the API server's clock is ahead of the host's, from a time the server stamped
/// (`stamped`, whole seconds) on a request the host sent at `asked`: within a second behind the
/// truth (the stamp's truncation) and one request's latency ahead of it.
pub fn server_offset(stamped: Timestamp, asked: Timestamp) -> SignedDuration {
    stamped.duration_since(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_with_either_sign_and_bad_ones_say_why() {
        let cases = [
            ("+6h", Ok(SignedDuration::from_hours(6))),
            ("6h", Ok(SignedDuration::from_hours(6))),
            ("-90m", Ok(SignedDuration::from_mins(-90))),
            ("0s", Ok(SignedDuration::ZERO)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_offset(text), want, "{text}");
        }
        for bad in ["", "six hours", "+-1h"] {
            let error = parse_offset(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn the_server_offset_is_the_stamp_less_the_asking_time() {
        let asked: Timestamp = "2026-12-07T10:00:00.400Z".parse().unwrap();
        // A server 6 hours ahead stamped 16:00:00 (truncated from 16:00:00.45).
        let stamped: Timestamp = "2026-12-07T16:00:00Z".parse().unwrap();
        assert_eq!(
            server_offset(stamped, asked),
            SignedDuration::from_hours(6) - SignedDuration::from_millis(400)
        );
        // A server behind the host.
        let behind: Timestamp = "2026-12-07T09:55:00Z".parse().unwrap();
        assert_eq!(
            server_offset(behind, asked),
            -(SignedDuration::from_mins(5) + SignedDuration::from_millis(400))
        );
        // The host's clock moved by a test's offset; none that leaves the range panics.
        assert!(host_now(SignedDuration::from_hours(1)) > Timestamp::now());
        let _ = host_now(SignedDuration::MAX);
    }
}
