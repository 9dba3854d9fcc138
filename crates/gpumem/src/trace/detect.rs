//! Format detection from the content of a file, not from its name.
//!
//! Order of the checks: gzip magic (`1f 8b`, inflated by the caller, then detected again), the
//! pickle `PROTO` byte `0x80` (protocol 2 and later) or a text-protocol pickle that starts with
//! `(`, `}` or `]` and ends with `.`, an RMM CSV header (`Thread,Time,Action,Pointer,...`), and a
//! line starting with `{` (JSON lines). Anything else is named: an empty file, a Git LFS pointer,
//! an HTML page, other text or binary data.
use super::{Format, TraceError};
use std::io::Read;

/// The two magic bytes that start a gzip member (RFC 1952, section 2.3.1).
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// The pickle `PROTO` opcode that starts every pickle of protocol 2 or later.
pub const PICKLE_PROTO: u8 = 0x80;
/// The first line of a Git LFS pointer file.
pub const LFS_POINTER: &[u8] = b"version https://git-lfs.github.com/spec/";

/// Whether `bytes` start with the gzip magic.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&GZIP_MAGIC)
}

/// Inflates a gzip file (all its members) in memory.
///
/// # Errors
/// [`TraceError::Malformed`] (index 0) when the gzip data is truncated or corrupt.
pub fn gunzip(name: &str, bytes: &[u8]) -> Result<Vec<u8>, TraceError> {
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(8));
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| TraceError::Malformed {
            path: name.to_string(),
            index: 0,
            message: format!(
                "gzip data truncated or corrupt after {} inflated bytes: {e}",
                out.len()
            ),
        })?;
    Ok(out)
}

/// Detects the format of (already inflated) `bytes`.
///
/// # Errors
/// A description of what the bytes are instead of a trace (for [`TraceError::NotATrace`]).
pub fn detect(bytes: &[u8]) -> Result<Format, String> {
    if bytes.is_empty() {
        return Err("the file is empty".into());
    }
    if bytes[0] == PICKLE_PROTO {
        return match bytes.get(1) {
            Some(2..=5) => Ok(Format::TorchSnapshot),
            Some(p) => Err(format!(
                "looks like a pickle but announces protocol {p} (expected 2 to 5)"
            )),
            None => Err("a single 0x80 byte (a pickle cut after its first byte)".into()),
        };
    }
    if matches!(bytes[0], b'(' | b'}' | b']') && bytes.ends_with(b".") {
        return Ok(Format::TorchSnapshot);
    }
    for (magic, what) in [
        (
            &b"PK\x03\x04"[..],
            "a ZIP archive (a torch.save checkpoint?), not a memory snapshot",
        ),
        (
            &b"\x28\xb5\x2f\xfd"[..],
            "zstd-compressed data: decompress it first (zstd -d)",
        ),
        (
            &b"\xfd7zXZ\x00"[..],
            "xz-compressed data: decompress it first (xz -d)",
        ),
        (
            &b"BZh"[..],
            "bzip2-compressed data: decompress it first (bunzip2)",
        ),
    ] {
        if bytes.starts_with(magic) {
            return Err(what.into());
        }
    }
    let text = strip_bom(bytes);
    let start = text
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(text.len());
    let text = &text[start..];
    if text.is_empty() {
        return Err("the file holds only white space".into());
    }
    if text.starts_with(LFS_POINTER) {
        return Err(
            "a Git LFS pointer, not the file itself (run `git lfs pull` to fetch it)".into(),
        );
    }
    let first_line = first_line(text);
    let lower = String::from_utf8_lossy(&first_line[..first_line.len().min(64)]).to_lowercase();
    if lower.starts_with("<!doctype html")
        || lower.starts_with("<html")
        || lower.starts_with("<?xml")
    {
        return Err("an HTML/XML page (a failed download or a login page?)".into());
    }
    if is_rmm_header(first_line) {
        return Ok(Format::RmmCsv);
    }
    if text[0] == b'{' {
        return Ok(Format::JsonLines);
    }
    let sample = &bytes[..bytes.len().min(512)];
    let binary = sample
        .iter()
        .filter(|&&b| b < 0x09 || (0x0e..0x20).contains(&b))
        .count();
    if binary > 0 {
        Err(format!(
            "binary data that is neither gzip nor a pickle (first bytes {})",
            hex_prefix(bytes)
        ))
    } else {
        Err(format!(
            "text that is neither an RMM CSV log (header Thread,Time,Action,Pointer,Size,Stream) \
             nor JSON lines; first line: {:?}",
            String::from_utf8_lossy(&first_line[..first_line.len().min(80)])
        ))
    }
}

fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes)
}

fn first_line(text: &[u8]) -> &[u8] {
    let end = text.iter().position(|&b| b == b'\n').unwrap_or(text.len());
    let line = &text[..end];
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Whether a line is the RMM `logging_resource_adaptor` CSV header.
fn is_rmm_header(line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(line);
    let cols: Vec<&str> = line.split(',').map(str::trim).collect();
    ["Thread", "Action", "Pointer", "Size"]
        .iter()
        .all(|want| cols.iter().any(|c| c.eq_ignore_ascii_case(want)))
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn detects_formats() {
        assert_eq!(detect(b"\x80\x04\x95."), Ok(Format::TorchSnapshot));
        assert_eq!(detect(b"(dp0\n."), Ok(Format::TorchSnapshot));
        assert_eq!(
            detect(b"Thread,Time,Action,Pointer,Size,Stream\n"),
            Ok(Format::RmmCsv)
        );
        assert_eq!(detect(b"\n{\"action\":\"alloc\"}\n"), Ok(Format::JsonLines));
    }

    #[test]
    fn names_what_is_not_a_trace() {
        let lfs = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n";
        assert!(detect(lfs).unwrap_err().contains("Git LFS pointer"));
        assert!(detect(b"<!DOCTYPE html><html></html>")
            .unwrap_err()
            .contains("HTML"));
        assert!(detect(b"").unwrap_err().contains("empty"));
        assert!(detect(b"\x00\x01\x02\xff").unwrap_err().contains("binary"));
        assert!(detect(b"hello world\n")
            .unwrap_err()
            .contains("hello world"));
        assert!(detect(b"\x80\x09").unwrap_err().contains("protocol 9"));
        assert!(detect(b"PK\x03\x04\x14\x00").unwrap_err().contains("ZIP"));
        assert!(detect(b"\x28\xb5\x2f\xfd\x00")
            .unwrap_err()
            .contains("zstd -d"));
    }
}
