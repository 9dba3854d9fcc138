//! RMM `logging_resource_adaptor` CSV logs.
//!
//! The adaptor (rmm/mr/device/logging_resource_adaptor.hpp) writes a header
//! `Thread,Time,Action,Pointer,Size,Stream` and one line per call: `Action` is `allocate`,
//! `allocate failure` or `free`; `Pointer` is hexadecimal (`0x7f...`); `Size` is bytes; `Stream`
//! is a hexadecimal or decimal handle; `Time` is a time of day `HH:MM:SS.ffffff` or
//! `HH:MM:SS:ffffff` (read as microseconds since midnight) or `seconds[.ffffff]` since the epoch
//! (read as microseconds). Columns are found by their header names, in any order. `allocate` →
//! [`Action::Alloc`], `free` (or `deallocate`) → [`Action::Free`],
//! `allocate failure` → [`Action::Oom`] (the size is the failed request). RMM logs everything
//! from the adaptor's creation, so a free of an address that is not live is an error.
use super::live::{AddrStyle, Liveness, UnknownFree};
use super::{Action, Event, Format, ReadConfig, Trace, TraceError};
use std::num::IntErrorKind;

/// Column positions found in the header.
struct Columns {
    time: Option<usize>,
    action: usize,
    pointer: usize,
    size: usize,
    stream: Option<usize>,
}

fn field<'r>(rec: &'r csv::ByteRecord, i: usize, name: &str) -> Result<&'r str, String> {
    let raw = rec
        .get(i)
        .ok_or_else(|| format!("no {name} column ({} fields)", rec.len()))?;
    std::str::from_utf8(raw)
        .map(str::trim)
        .map_err(|_| format!("{name} is not UTF-8"))
}

/// Parses `0x…` as hexadecimal, anything else as decimal.
fn parse_handle(s: &str, name: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<u64>(),
    };
    r.map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("{name} {s:?} does not fit in 64 bits"),
        _ => format!("{name} {s:?} is not a hexadecimal (0x...) or decimal number"),
    })
}

/// Parses `whole[.fraction]` seconds into microseconds (the fraction is cut to 6 digits).
fn seconds_to_us(whole: &str, frac: &str) -> Option<i64> {
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let mut us = 0i64;
    for d in frac.bytes().chain(std::iter::repeat(b'0')).take(6) {
        us = us * 10 + i64::from(d - b'0');
    }
    whole.checked_mul(1_000_000)?.checked_add(us)
}

/// RMM's time stamps, to microseconds: `HH:MM:SS.ffffff` or `HH:MM:SS:ffffff` (time of day,
/// since midnight; RMM's own replay parser reads the latter) or `seconds[.ffffff]` (since the
/// epoch, as RMM's logging guide shows).
fn parse_time(s: &str) -> Result<i64, String> {
    let bad = || format!("Time {s:?} is neither HH:MM:SS.ffffff nor seconds[.ffffff]");
    if !s.contains(':') {
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        return seconds_to_us(whole, frac).ok_or_else(bad);
    }
    let parts: Vec<&str> = s.split(':').collect();
    let (h, m, sec_us) = match parts.as_slice() {
        [h, m, sec] => {
            let (whole, frac) = sec.split_once('.').unwrap_or((sec, ""));
            (h, m, seconds_to_us(whole, frac))
        }
        [h, m, sec, us] => (h, m, seconds_to_us(sec, us)),
        _ => return Err(bad()),
    };
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    let sec_us = sec_us.ok_or_else(bad)?;
    h.checked_mul(60)
        .and_then(|x| x.checked_add(m))
        .and_then(|x| x.checked_mul(60_000_000))
        .and_then(|x| x.checked_add(sec_us))
        .ok_or_else(bad)
}

/// Reads an RMM `logging_resource_adaptor` CSV log.
///
/// # Errors
/// [`TraceError::NotATrace`] when the header lacks the `Action`, `Pointer` or `Size` column;
/// [`TraceError::Malformed`] naming the line (1-based; `index` is the line number − 1) for a
/// record with the wrong number of fields, a non-numeric pointer, size, stream or time, an
/// unknown action, a free of an address that is not live or an allocation at a live address
/// (unless `options.lenient`, which skips and counts them).
pub fn read_rmm(name: &str, data: &[u8], options: ReadConfig) -> Result<Trace, TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(data);
    let header = rdr.byte_headers().map_err(|e| TraceError::Malformed {
        path: name.to_string(),
        index: 0,
        message: format!("line 1: CSV header: {e}"),
    })?;
    let find = |want: &str| {
        header
            .iter()
            .position(|h| String::from_utf8_lossy(h).trim().eq_ignore_ascii_case(want))
    };
    let missing = |c: &str| TraceError::NotATrace {
        path: name.to_string(),
        what: format!("CSV without a {c} column: not an RMM log"),
    };
    let cols = Columns {
        time: find("Time"),
        action: find("Action").ok_or_else(|| missing("Action"))?,
        pointer: find("Pointer").ok_or_else(|| missing("Pointer"))?,
        size: find("Size").ok_or_else(|| missing("Size"))?,
        stream: find("Stream"),
    };
    let mut trace = Trace {
        format: Some(Format::RmmCsv),
        ..Trace::default()
    };
    let mut live = Liveness::new(UnknownFree::Error, AddrStyle::Hex);
    let mut rec = csv::ByteRecord::new();
    loop {
        let line_no = rdr.position().line();
        let result = match rdr.read_byte_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {
                let line = rec.position().map_or(line_no, csv::Position::line);
                // Messages write the address as this line wrote it.
                let hex = rec.get(cols.pointer).is_some_and(|p| {
                    let p = p.trim_ascii_start();
                    p.starts_with(b"0x") || p.starts_with(b"0X")
                });
                live.style = if hex {
                    AddrStyle::Hex
                } else {
                    AddrStyle::Decimal
                };
                (
                    line,
                    record_event(&rec, &cols)
                        .and_then(|ev| live.admit_line(&mut trace, ev, line, |_, _| 0)),
                )
            }
            Err(e) => {
                let line = e.position().map_or(line_no, csv::Position::line);
                let what = match e.kind() {
                    csv::ErrorKind::UnequalLengths {
                        expected_len, len, ..
                    } => format!(
                        "{len} field{}, expected {expected_len} as in the header",
                        if *len == 1 { "" } else { "s" }
                    ),
                    _ => e.to_string(),
                };
                (line, Err(format!("CSV: {what}")))
            }
        };
        if let (line, Err(e)) = result {
            if options.lenient {
                trace.skip(format!("line {line}: {e}"));
            } else {
                return Err(TraceError::Malformed {
                    path: name.to_string(),
                    index: line.saturating_sub(1),
                    message: format!("line {line}: {e}"),
                });
            }
        }
    }
    Ok(trace)
}

fn record_event(rec: &csv::ByteRecord, cols: &Columns) -> Result<Event, String> {
    let action = match field(rec, cols.action, "Action")? {
        "allocate" => Action::Alloc,
        "free" | "deallocate" => Action::Free,
        "allocate failure" => Action::Oom,
        other => {
            return Err(format!(
                "Action {other:?}, expected allocate, allocate failure, free or deallocate"
            ))
        }
    };
    let addr = parse_handle(field(rec, cols.pointer, "Pointer")?, "Pointer")?;
    let size_s = field(rec, cols.size, "Size")?;
    let size_bytes = size_s.parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => format!("Size {size_s:?} (bytes) does not fit in 64 bits"),
        _ => format!("Size {size_s:?} is not a non-negative integer (bytes)"),
    })?;
    let stream = match cols.stream {
        Some(i) => parse_handle(field(rec, i, "Stream")?, "Stream")?,
        None => 0,
    };
    let time_us = match cols.time {
        Some(i) => Some(parse_time(field(rec, i, "Time")?)?),
        None => None,
    };
    Ok(Event {
        stream,
        time_us,
        ..Event::new(action, addr, size_bytes)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const HEAD: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

    #[test]
    fn reads_a_log() {
        let log = format!(
            "{HEAD}1,10:00:01.5,allocate,0x7f0000000000,256,0x0\n\
             1,10:00:01.000002,allocate failure,0x0,1099511627776,0x1a\n\
             1,10:00:02.25,free,0x7f0000000000,256,0\n"
        );
        let t = read_rmm("r.csv", log.as_bytes(), ReadConfig::default()).unwrap();
        let a: Vec<Action> = t.events.iter().map(|e| e.action).collect();
        assert_eq!(a, [Action::Alloc, Action::Oom, Action::Free]);
        assert_eq!(t.events[0].addr, 0x7f00_0000_0000);
        assert_eq!(t.events[0].time_us, Some(36_001_500_000));
        assert_eq!(t.events[1].stream, 0x1a);
        assert_eq!(t.events[1].size_bytes, 1 << 40);
    }

    #[test]
    fn errors_name_the_line() {
        let log = format!("{HEAD}1,10:00:01,allocate,0x10,12x,0\n");
        let e = read_rmm("r.csv", log.as_bytes(), ReadConfig::default()).unwrap_err();
        assert!(e.to_string().contains("line 2: Size \"12x\""), "{e}");
        let log = format!("{HEAD}1,10:00:01,free,0x10,12,0\n");
        let e = read_rmm("r.csv", log.as_bytes(), ReadConfig::default()).unwrap_err();
        assert!(
            e.to_string().contains("line 2: free of address 0x10"),
            "{e}"
        );
        let log = format!("{HEAD}1,10:00:01,allocate,0x10\n");
        let e = read_rmm("r.csv", log.as_bytes(), ReadConfig::default()).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("line 2: CSV: 4 fields, expected 6 as in the header"),
            "{e}"
        );
    }

    /// A number too large for 64 bits was called "not a non-negative integer" (Size) or "not
    /// a hexadecimal or decimal number" (Pointer); it is now said to be too large.
    #[test]
    fn a_number_past_64_bits_is_said_too_large() {
        for (row, said) in [
            (
                "1,10:00:01,allocate,0x10,99999999999999999999,0",
                "line 2: Size \"99999999999999999999\" (bytes) does not fit in 64 bits",
            ),
            (
                "1,10:00:01,allocate,0x10000000000000000,16,0",
                "line 2: Pointer \"0x10000000000000000\" does not fit in 64 bits",
            ),
            (
                "1,10:00:01,allocate,99999999999999999999,16,0",
                "line 2: Pointer \"99999999999999999999\" does not fit in 64 bits",
            ),
            (
                "1,10:00:01,allocate,0x10,-1,0",
                "line 2: Size \"-1\" is not a non-negative integer (bytes)",
            ),
            (
                "1,10:00:01,allocate,zz,16,0",
                "line 2: Pointer \"zz\" is not a hexadecimal (0x...) or decimal number",
            ),
        ] {
            let log = format!("{HEAD}{row}\n");
            let e = read_rmm("r.csv", log.as_bytes(), ReadConfig::default()).unwrap_err();
            assert!(e.to_string().ends_with(said), "{e}");
        }
    }

    #[test]
    fn time_parsing() {
        assert_eq!(parse_time("00:00:01.000001"), Ok(1_000_001));
        assert_eq!(parse_time("01:00:01:000250"), Ok(3_601_000_250));
        assert_eq!(parse_time("1634567890.123456"), Ok(1_634_567_890_123_456));
        assert_eq!(parse_time("12"), Ok(12_000_000));
        assert!(parse_time("ab:cd").is_err());
        assert!(parse_time("1:2:3:4:5").is_err());
        assert!(parse_time("1.5x").is_err());
        assert!(parse_time("9223372036854775807:00:00").is_err());
        assert!(parse_time("9223372036854775807").is_err());
    }
}
