//! gpumem JSON lines: the simplest trace format, and the one every trace converts to.
//!
//! ## The gpumem JSON lines trace format
//!
//! One JSON object per line (UTF-8, `\n` or `\r\n` line ends; blank lines are ignored), in the
//! order the events happened:
//!
//! ```text
//! {"action":"alloc","addr":1,"size":1048576}
//! {"action":"alloc","addr":2,"size":512,"stream":7,"time_us":1200,"align":4096}
//! {"action":"free","addr":1}
//! ```
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `action` | string, required | `alloc`, `free`, `free_requested` (the block was freed but waits for other streams, PyTorch's `record_stream`: it leaves the allocated bytes here and the requested bytes at its later `free`), or `preexisting`; informational: `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`, `oom`, `snapshot` |
//! | `addr` | unsigned integer, required (except `oom`, `snapshot`) | device address, or any id unique among the live blocks |
//! | `size` | unsigned integer, bytes | required for `alloc` (the requested bytes) and `preexisting`; optional for `free` (the block's size is known from its alloc) |
//! | `stream` | unsigned integer | CUDA stream handle; default 0 (the default stream) |
//! | `device` | unsigned integer | device ordinal; default 0 |
//! | `time_us` | integer | microseconds since any epoch; optional |
//! | `align` | unsigned integer, a power of two, bytes | requested alignment of an `alloc`; default 256 |
//! | `device_free` | unsigned integer, bytes | `oom` only: what the driver reported free on the device when the request failed |
//!
//! Rules: an `alloc` at an `addr` that is live on the same device is an error, and so is a
//! `free` of an `addr` that is not live. A block that was already allocated when recording
//! started is declared by a `preexisting` line (`addr`, `size`, optional `device`), normally at
//! the top of the file; it may then be freed like any other block. Unknown keys are ignored;
//! one that is a single edit away from a known key (`aling`, `strem`) gets a warning in
//! [`Trace::warnings`] naming its first line and the key it resembles.
//! Errors name the line number (1-based) and write an address in decimal, as the file does,
//! with the hex in brackets (`free of address 991 (0x3df)`). [`write_jsonl`] writes any [`Trace`] in this format,
//! so PyTorch snapshots and RMM logs convert losslessly (for the fields above).
use super::live::{AddrStyle, Liveness, UnknownFree};
use super::{Action, Event, Format, PreexistingBlock, ReadConfig, RecordedOom, Trace, TraceError};
use serde::Deserialize;
use std::io::Write;

/// Declares, from one list of keys, [`StrictLine`] (unknown keys refused), [`Line`] (unknown
/// keys ignored), the conversion between them and [`KEYS`]: a macro, because a function
/// cannot declare the two structs.
macro_rules! line_structs {
    ($($key:ident: $ty:ty,)*) => {
        /// One line as deserialised (types checked by serde, meaning checked by [`read_jsonl`]).
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct StrictLine {
            $($key: $ty,)*
        }

        /// The keys of a line, as [`StrictLine`] has them.
        const KEYS: [&str; 8] = [$(stringify!($key),)*];

        /// [`StrictLine`] that ignores unknown keys (tried after the strict one refused one).
        #[derive(Deserialize)]
        struct Line {
            $($key: $ty,)*
        }

        impl From<StrictLine> for Line {
            fn from(l: StrictLine) -> Line {
                Line {
                    $($key: l.$key,)*
                }
            }
        }
    };
}

line_structs! {
    action: String,
    addr: Option<u64>,
    size: Option<u64>,
    stream: Option<u64>,
    device: Option<u32>,
    time_us: Option<i64>,
    align: Option<u64>,
    device_free: Option<u64>,
}

/// serde_json's message without its "at line 1 column C" (each line is parsed alone, so that
/// line number would contradict the file's), with the column kept; a line that is not JSON at
/// all says so first (serde's "expected ident" alone does not).
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let msg = match text.rfind(" at line ") {
        Some(i) => &text[..i],
        None => &text,
    };
    let msg = if e.is_syntax() || e.is_eof() {
        format!("not valid JSON: {msg}")
    } else {
        msg.to_string()
    };
    if e.column() > 0 {
        format!("{msg} (column {})", e.column())
    } else {
        msg.to_string()
    }
}

/// [`json_error`] of a line that does not parse, with the key whose value is wrong where
/// there is one (`invalid type: string "big", expected a whole number ≥ 0 (column 39, key
/// "size")`).
fn keyed_json_error(text: &str, strict: &serde_json::Error) -> String {
    let mut de = serde_json::Deserializer::from_str(text);
    match serde_path_to_error::deserialize::<_, Line>(&mut de) {
        Err(e) => {
            let path = e.path().to_string();
            // serde's type names, in words: `-512`, "expected u64" → a whole number ≥ 0.
            let mut msg = json_error(e.inner())
                .replace("expected u64", "expected a whole number ≥ 0")
                .replace(
                    "expected u32",
                    "expected a whole number from 0 to 4294967295",
                )
                .replace("expected i64", "expected a whole number");
            // An integer too large for 64 bits is read as a float: say what the line wrote.
            if let Some(rest) = msg.strip_prefix("invalid type: floating point `") {
                let upto = text.get(..e.inner().column()).unwrap_or_default();
                let digits = upto.len()
                    - upto
                        .trim_end_matches(|c: char| c.is_ascii_digit())
                        .trim_end_matches('-')
                        .len();
                let literal = &upto[upto.len() - digits..];
                if let (true, Some((_, after))) = (
                    literal.trim_start_matches('-').len() > 15,
                    rest.split_once('`'),
                ) {
                    msg =
                        format!("invalid value: integer {literal} does not fit in 64 bits{after}");
                }
            }
            // serde_path_to_error says `?` where the error came before any key was known.
            if path.is_empty() || path == "." || path == "?" {
                msg
            } else if let Some(open) = msg.strip_suffix(')') {
                format!("{open}, key \"{path}\")")
            } else {
                format!("{msg} (key \"{path}\")")
            }
        }
        Ok(_) => json_error(strict),
    }
}

/// What a JSON value is, in words (`an array`, `a number`, `null`, ...).
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// An unknown key and the known key it is one edit away from.
type Typo = (String, &'static str);

/// Keys of `text` (a JSON object) that are not known but one edit (insert, delete, replace or
/// swap two neighbours) away from a known key: `(unknown, known)`.
fn near_misses(text: &str) -> Vec<Typo> {
    let Ok(map) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) else {
        return Vec::new();
    };
    map.keys()
        .filter(|k| !KEYS.contains(&k.as_str()))
        .filter_map(|k| {
            KEYS.iter()
                .find(|known| strsim::damerau_levenshtein(k, known) == 1)
                .map(|known| (k.clone(), *known))
        })
        .collect()
}

/// The name of an action in JSON lines.
pub fn action_name(action: Action) -> &'static str {
    match action {
        Action::Alloc => "alloc",
        Action::Free => "free",
        Action::FreeRequested => "free_requested",
        Action::SegmentAlloc => "segment_alloc",
        Action::SegmentFree => "segment_free",
        Action::SegmentMap => "segment_map",
        Action::SegmentUnmap => "segment_unmap",
        Action::Oom => "oom",
        Action::Snapshot => "snapshot",
    }
}

/// What a line declares.
enum Parsed {
    Event(Event, Option<u64>),
    Preexisting(PreexistingBlock),
}

/// Parses one line; also returns unknown keys that look like typos of known ones.
fn parse_line(text: &str) -> Result<(Parsed, Vec<Typo>), String> {
    let (l, typos) = match serde_json::from_str::<StrictLine>(text) {
        Ok(l) => (Line::from(l), Vec::new()),
        Err(strict) => match serde_json::from_str::<Line>(text) {
            Ok(l) => (l, near_misses(text)),
            Err(_) => {
                return Err(match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(v) if !v.is_object() => format!(
                        "expected a JSON object such as {{\"action\":\"alloc\",...}}, found {}",
                        json_kind(&v)
                    ),
                    _ => keyed_json_error(text, &strict),
                })
            }
        },
    };
    match parse_fields(l) {
        Ok(p) => Ok((p, typos)),
        // A missing key is often a misspelt one: say so in the error itself.
        Err(e) => Err(typos.iter().fold(e, |e, (unknown, known)| {
            format!("{e}; unknown key {unknown:?}: did you mean {known:?}?")
        })),
    }
}

fn parse_fields(l: Line) -> Result<Parsed, String> {
    let action = match l.action.as_str() {
        "alloc" => Action::Alloc,
        "free" => Action::Free,
        "free_requested" => Action::FreeRequested,
        "segment_alloc" => Action::SegmentAlloc,
        "segment_free" => Action::SegmentFree,
        "segment_map" => Action::SegmentMap,
        "segment_unmap" => Action::SegmentUnmap,
        "oom" => Action::Oom,
        "snapshot" => Action::Snapshot,
        "preexisting" => {
            return Ok(Parsed::Preexisting(PreexistingBlock {
                addr: l.addr.ok_or("a preexisting line needs \"addr\"")?,
                size_bytes: l.size.ok_or("a preexisting line needs \"size\" (bytes)")?,
                device: l.device.unwrap_or(0),
                freed_at_event: None,
            }))
        }
        other => {
            return Err(format!(
                "unknown action {other:?}, expected alloc, free, free_requested, preexisting, \
                 segment_alloc, segment_free, segment_map, segment_unmap, oom or snapshot"
            ))
        }
    };
    let addr = match (l.addr, action) {
        (Some(a), _) => a,
        (None, Action::Oom | Action::Snapshot) => 0,
        (None, _) => return Err(format!("{:?} needs \"addr\"", l.action)),
    };
    let size_bytes = match (l.size, action) {
        (Some(s), _) => s,
        (None, Action::Alloc) => return Err("\"alloc\" needs \"size\" (bytes)".into()),
        // A recorded out-of-memory is judged by the request that failed.
        (None, Action::Oom) => {
            return Err("\"oom\" needs \"size\" (the bytes of the request that failed)".into())
        }
        (None, _) => 0,
    };
    if let Some(a) = l.align {
        if !a.is_power_of_two() {
            return Err(format!("\"align\" {a} is not a power of two"));
        }
    }
    Ok(Parsed::Event(
        Event {
            action,
            addr,
            size_bytes,
            stream: l.stream.unwrap_or(0),
            device: l.device.unwrap_or(0),
            time_us: l.time_us,
            align: l.align,
        },
        l.device_free,
    ))
}

/// Reads gpumem JSON lines (see the module documentation).
///
/// # Errors
/// [`TraceError::NotATrace`] when the first line is JSON but not a trace event (a stats file,
/// a pretty-printed document); [`TraceError::Malformed`] naming the line (1-based; `index` is
/// the line number − 1) for invalid JSON, wrong types, negative or missing sizes, an unknown
/// action, a free of an address that is not live or an alloc at a live address (unless
/// `options.lenient`, which skips and counts them).
pub fn read_jsonl(name: &str, data: &[u8], options: ReadConfig) -> Result<Trace, TraceError> {
    let mut trace = Trace {
        format: Some(Format::JsonLines),
        ..Trace::default()
    };
    let mut live = Liveness::new(UnknownFree::Error, AddrStyle::Decimal);
    let mut seen_first = false;
    let mut warned = std::collections::BTreeSet::new();
    for (i, raw) in data.split(|&b| b == b'\n').enumerate() {
        let line_no = i as u64 + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let raw = if i == 0 {
            raw.strip_prefix(b"\xef\xbb\xbf").unwrap_or(raw)
        } else {
            raw
        };
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let parsed = std::str::from_utf8(raw)
            .map_err(|e| format!("not UTF-8: {e}"))
            .and_then(parse_line);
        if !seen_first {
            seen_first = true;
            if let Err(e) = &parsed {
                if let Some(what) = not_a_trace(data, raw) {
                    return Err(TraceError::NotATrace {
                        path: name.to_string(),
                        what,
                    });
                }
                if !options.lenient {
                    return Err(malformed_line(name, line_no, e));
                }
            }
        }
        let result = parsed.and_then(|(p, typos)| {
            for (unknown, known) in typos {
                if warned.insert(unknown.clone()) {
                    trace.warn(format!(
                        "line {line_no}: unknown key {unknown:?} ignored; did you mean {known:?}?"
                    ));
                }
            }
            match p {
                Parsed::Event(ev, device_free) => {
                    let at = trace.events.len() as u64;
                    live.admit_line(&mut trace, ev, line_no, |_, _| 0)?;
                    if ev.action == Action::Oom {
                        trace.ooms.push(RecordedOom {
                            event: at,
                            device_free_bytes: device_free,
                        });
                    }
                    Ok(())
                }
                Parsed::Preexisting(b) => live.declare_preexisting(&mut trace, b),
            }
        });
        if let Err(e) = result {
            if options.lenient {
                trace.skip(format!("line {line_no}: {e}"));
            } else {
                return Err(malformed_line(name, line_no, &e));
            }
        }
    }
    Ok(trace)
}

fn malformed_line(name: &str, line_no: u64, e: &str) -> TraceError {
    TraceError::Malformed {
        path: name.to_string(),
        index: line_no - 1,
        message: format!("line {line_no}: {e}"),
    }
}

/// When the first line does not parse as an event: says what the file is if it is JSON of
/// another kind.
fn not_a_trace(data: &[u8], first: &[u8]) -> Option<String> {
    let keys = |v: &serde_json::Value| -> Option<String> {
        let o = v.as_object()?;
        if o.contains_key("action") {
            return None;
        }
        Some(o.keys().take(6).cloned().collect::<Vec<_>>().join(", "))
    };
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(first) {
        return keys(&v).map(|k| {
            format!("JSON objects without \"action\" (keys: {k}), not gpumem JSON lines")
        });
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        return Some(match keys(&v) {
            Some(k) => format!("a JSON document (keys: {k}), not gpumem JSON lines"),
            None => "a pretty-printed JSON document, not JSON lines (one object per line)".into(),
        });
    }
    None
}

/// Writes `trace` as gpumem JSON lines: its pre-existing blocks first, then every event.
/// Skipped events are not written.
///
/// ```
/// use gpumem::trace::{jsonl::write_jsonl, read_bytes, ReadConfig};
/// let csv = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.5,allocate,0x7f00,256,0x0\n";
/// let trace = read_bytes("rmm.csv", csv, ReadConfig::default())?;
/// let mut out = Vec::new();
/// write_jsonl(&trace, &mut out).expect("writing to a Vec");
/// assert_eq!(
///     String::from_utf8_lossy(&out),
///     "{\"action\":\"alloc\",\"addr\":32512,\"size\":256,\"time_us\":36000500000}\n"
/// );
/// # Ok::<(), gpumem::trace::TraceError>(())
/// ```
///
/// # Errors
/// The writer's I/O error.
pub fn write_jsonl<W: Write>(trace: &Trace, writer: W) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(writer);
    for b in &trace.preexisting {
        write!(
            w,
            "{{\"action\":\"preexisting\",\"addr\":{},\"size\":{}",
            b.addr, b.size_bytes
        )?;
        if b.device != 0 {
            write!(w, ",\"device\":{}", b.device)?;
        }
        w.write_all(b"}\n")?;
    }
    let ooms: std::collections::HashMap<u64, Option<u64>> = trace
        .ooms
        .iter()
        .map(|o| (o.event, o.device_free_bytes))
        .collect();
    for (i, e) in trace.events.iter().enumerate() {
        write!(
            w,
            "{{\"action\":\"{}\",\"addr\":{}",
            action_name(e.action),
            e.addr
        )?;
        if e.size_bytes != 0 || matches!(e.action, Action::Alloc | Action::Oom) {
            write!(w, ",\"size\":{}", e.size_bytes)?;
        }
        if e.stream != 0 {
            write!(w, ",\"stream\":{}", e.stream)?;
        }
        if e.device != 0 {
            write!(w, ",\"device\":{}", e.device)?;
        }
        if let Some(t) = e.time_us {
            write!(w, ",\"time_us\":{t}")?;
        }
        if let Some(a) = e.align {
            write!(w, ",\"align\":{a}")?;
        }
        if e.action == Action::Oom {
            let free = ooms.get(&(i as u64)).copied().flatten();
            if let Some(f) = free {
                write!(w, ",\"device_free\":{f}")?;
            }
        }
        w.write_all(b"}\n")?;
    }
    w.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn read(s: &str) -> Result<Trace, TraceError> {
        read_jsonl("t.jsonl", s.as_bytes(), ReadConfig::default())
    }

    /// The message of the error reading `s` gives.
    fn read_err(s: &str) -> String {
        read(s).unwrap_err().to_string()
    }

    #[test]
    fn reads_and_fills_free_size() {
        let t = read(
            "{\"action\":\"alloc\",\"addr\":1,\"size\":100,\"align\":4096}\n\n\
             {\"action\":\"free\",\"addr\":1}\r\n",
        )
        .unwrap();
        assert_eq!(t.events.len(), 2);
        assert_eq!(t.events[0].align, Some(4096));
        assert_eq!(t.events[1].size_bytes, 100);
    }

    #[test]
    fn errors_name_the_line() {
        let e = read(
            "{\"action\":\"alloc\",\"addr\":1,\"size\":1}\n{\"action\":\"free\",\"addr\":2}\n",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("line 2: free of address 2 (0x2) (device 0)"),
            "{e}"
        );
        let e = read("{\"action\":\"alloc\",\"addr\":1,\"size\":-5}\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("line 1: invalid value: integer `-5`"),
            "{e}"
        );
        let e = read("{\"action\":\"alloc\",\"addr\":1,\"size\":1,\"align\":3}\n").unwrap_err();
        assert!(e.to_string().contains("not a power of two"), "{e}");
    }

    #[test]
    fn lenient_skips_and_counts() {
        let t = read_jsonl(
            "t",
            b"{\"action\":\"alloc\",\"addr\":1,\"size\":1}\n{\"action\":\"alloc\",\"addr\":1,\"size\":1}\nnot json\n",
            ReadConfig { lenient: true, ..ReadConfig::default() },
        )
        .unwrap();
        assert_eq!(
            (t.events.len(), t.skipped_count, t.skipped.len()),
            (1, 2, 2)
        );
    }

    #[test]
    fn stats_json_is_not_a_trace() {
        let e = read("{\n  \"reserved_bytes.all.peak\": 5\n}\n").unwrap_err();
        assert!(matches!(e, TraceError::NotATrace { .. }), "{e}");
        assert!(e.to_string().contains("reserved_bytes.all.peak"), "{e}");
    }

    #[test]
    fn preexisting_round_trip() {
        let t = read(
            "{\"action\":\"preexisting\",\"addr\":9,\"size\":64}\n{\"action\":\"free\",\"addr\":9}\n",
        )
        .unwrap();
        assert_eq!(t.preexisting[0].freed_at_event, Some(0));
        assert_eq!(t.events[0].size_bytes, 64);
        let mut out = Vec::new();
        write_jsonl(&t, &mut out).unwrap();
        let back = read(std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!(back.events, t.events);
        assert_eq!(back.preexisting, t.preexisting);
    }

    /// A value of the wrong type names its key, its line and its column.
    #[test]
    fn a_value_of_the_wrong_type_names_its_key() {
        let e = read_err(
            "{\"action\":\"alloc\",\"addr\":1,\"size\":100}\n\
             {\"action\":\"alloc\",\"addr\":2,\"size\":\"big\"}\n",
        );
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("expected a whole number ≥ 0"), "{e}");
        assert!(e.contains("key \"size\""), "{e}");
        // A negative size, in words; a line cut short names no key (serde's `?`).
        let e = read_err("{\"action\":\"alloc\",\"addr\":1,\"size\":-512}\n");
        assert!(
            e.contains("integer `-512`, expected a whole number ≥ 0"),
            "{e}"
        );
        let e = read_err("{\"action\":\"alloc\",\"addr\":2,\n");
        assert!(e.contains("line 1") && !e.contains("key \"?\""), "{e}");
    }

    /// Issue 9 item 8: typos of known keys are warned about with their line; a negative size
    /// names one line only.
    #[test]
    fn typo_keys_get_a_did_you_mean_and_errors_name_one_line() {
        let t = read(
            "{\"action\":\"alloc\",\"addr\":1,\"size\":100,\"note\":\"x\"}\n\
             {\"action\":\"alloc\",\"addr\":2,\"size\":64,\"aling\":4096}\n\
             {\"action\":\"alloc\",\"addr\":3,\"size\":64,\"strem\":7,\"aling\":8}\n",
        )
        .unwrap();
        assert_eq!(t.events.len(), 3);
        assert_eq!(t.events[1].align, None, "the typo is ignored, not guessed");
        assert_eq!(
            t.warnings,
            [
                "line 2: unknown key \"aling\" ignored; did you mean \"align\"?",
                "line 3: unknown key \"strem\" ignored; did you mean \"stream\"?"
            ]
        );
        let e = read_err(
            "{\"action\":\"alloc\",\"addr\":1,\"size\":1}\n\n\
             {\"action\":\"alloc\",\"addr\":2,\"size\":-64}\n",
        );
        assert!(e.contains("line 3: invalid value: integer `-64`"), "{e}");
        assert!(!e.contains("line 1"), "two different lines named: {e}");
        assert!(e.contains("(column "), "{e}");
    }

    /// A line that is not JSON says so, with the column (it said only "expected ident").
    #[test]
    fn a_line_that_is_not_json_says_so() {
        let e = read_err("{\"action\":\"alloc\",\"addr\":1,\"size\":1}\nnot json\n");
        assert!(
            e.contains("line 2: not valid JSON: expected ident (column 2)"),
            "{e}"
        );
        let e = read_err("{\"action\":\"alloc\",\"addr\":1,\"si\n");
        assert!(
            e.contains("line 1: not valid JSON: EOF while parsing"),
            "{e}"
        );
        // A well-formed line with a wrong value is JSON: no such prefix.
        let e = read_err("{\"action\":\"alloc\",\"addr\":1,\"size\":\"big\"}\n");
        assert!(!e.contains("not valid JSON"), "{e}");
    }

    #[test]
    fn oom_device_free_round_trips() {
        let text = "{\"action\":\"oom\",\"addr\":0,\"size\":4096,\"device_free\":1024}\n";
        let t = read(text).unwrap();
        assert_eq!(
            t.ooms,
            [RecordedOom {
                event: 0,
                device_free_bytes: Some(1024)
            }]
        );
        let mut out = Vec::new();
        write_jsonl(&t, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }
}
